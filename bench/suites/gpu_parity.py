"""Learning parity: does a model trained by our fast path learn what TRL's SFTTrainer learns?

    python -m bench.suites.gpu_parity --results bench/results/h100/parity-DATE     # 1B, ours vs TRL, FP8 vs bf16
    python -m bench.suites.gpu_parity --sides ours-plain,ours-plain+compile,...    # one switch at a time
    python -m bench.suites.gpu_parity --repeat 3 --sides ours,trl                  # each side 3 times: mean and spread
    python -m bench.suites.gpu_parity --merge A.json B.json --results DIR          # files of one config (one per GPU) as one
    python -m bench.suites.gpu_parity --cpu-smoke                                  # tiny shape on CPU
    python -m bench.suites.gpu_parity --plot bench/results/h100/parity-DATE/parity-llama3.2-1b.json

A learnable corpus (bench/common/arithmetic.py: multi-turn chats of integer arithmetic, rendered with the
chat template into token documents; the loss is on every token, the same objective on every side),
ONE saved initial checkpoint of the 1B shape (fp32 safetensors) that every side loads, the same
documents, the same schedule (AdamW 0.9/0.95, peak LR, --warmup-ratio warm-up, cosine to 0, --steps optimizer
steps, clipping at 1.0) and --budget tokens per step (one packed micro-batch). Sides:

  ours            the default fast path (attention auto, fused MLP auto, fused loss, compile)
  ours-fp8        the same with --precision fp8 (torchao float8 linears, tensorwise), fast forward accumulation
  ours-fp8-rowwise  the same with rowwise scaling
  ours-fp8-fullacc  ours-fp8 with the forward GEMMs accumulating in fp32: our default FP8
                  (train.fp8_fast_accum = false)
  trl             TRL's SFTTrainer padding-free (bench/peers/parity_trl.py), flex attention, fed our packed rows
                  in our order: the same tokens in every optimizer step, only the implementations differ
  trl-bfd         the same with TRL's own BFD packing and shuffled order (what a user's run sees)
  trl-sdpa        the same with SDPA attention (transformers masks each packed document from the
                  position ids): the reference for `ours` when `trl` did not finish (--trl-fallback)
  ours-plain      sdpa attention (padding-free through position ids), no fused MLP, full logits, eager
  ours-plain+X    the plain path with one switch on: attention (auto backend), mlp, loss, compile

Every side's final model is scored by the same function on the same held-out documents (`eval_loss`,
token-weighted mean cross-entropy, bf16 autocast), so the eval losses differ only by training. Train
loss per step side by side (table every --every steps, plot PNG), throughput (real tokens/s after
the shared warm-up) beside it, one JSON through bench/report/results_io.py. Targets: eval loss within 1% of
TRL's (ours) and of ours (each ours-fp8 side).

Repeats: GPU kernels are not deterministic and 120 steps of training are chaotic, so one run per side can
miss a 1% target by noise alone (three runs of `ours` at --warmup-ratio 0.1 on an H100: 0.955, 0.960,
0.998). --repeat N runs every side N times from the same init and data (on one GPU in turn); on several
GPUs start one process per GPU (CUDA_VISIBLE_DEVICES, its own --out and --name) and --merge their files.
Either way a side's eval loss is the mean of its repeats, each repeat's is kept, and every comparison
records its reference's spread (bench/report/parity_record.py: the record's shape).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, NoReturn

from bench.common.arithmetic import write_corpus
from bench.common.processes import TIMED_OUT, run_logged
from bench.suites.gpu_single import RUN_TIMEOUT_S, TINY, save_train_toml, steady_state
from bench.report.parity_record import comparisons, loss_table, merge, plot, run_name, side_entry, summary_lines
from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES
from contract.config import SHIPPED_TOKENIZER, TrainConfig

PLAIN = {"model": {"attn_implementation": "sdpa"},
         "train": {"fused_mlp": False, "fused_loss": False, "compile": False}}
SWITCHES = {"attention": ("model", "attn_implementation", "auto"), "mlp": ("train", "fused_mlp", "auto"),
            "loss": ("train", "fused_loss", True), "compile": ("train", "compile", True)}
# ours-fp8 and ours-fp8-rowwise keep the fast forward accumulation the files of 2026-11-26/27 ran with (then
# torchao's and our default); ours-fp8-fullacc is today's default FP8.
FP8_SIDES = {"ours-fp8": {"fp8_recipe": "tensorwise", "fp8_fast_accum": True},
             "ours-fp8-rowwise": {"fp8_recipe": "rowwise", "fp8_fast_accum": True},
             "ours-fp8-fullacc": {"fp8_recipe": "tensorwise", "fp8_fast_accum": False}}
SIDES = ["ours", *FP8_SIDES, "trl", "trl-bfd", "trl-sdpa", "ours-plain", *(f"ours-plain+{name}" for name in SWITCHES)]


def side_overrides(side: str) -> dict[str, dict[str, Any]]:
    """train.toml sections for one of our sides (on top of the shared settings)."""
    if side == "ours":
        return {}
    if side in FP8_SIDES:
        return {"train": {"precision": "fp8", **FP8_SIDES[side]}}
    overrides = {section: dict(values) for section, values in PLAIN.items()}
    if side.startswith("ours-plain+"):
        section, key, value = SWITCHES[side.removeprefix("ours-plain+")]
        overrides[section][key] = value
    elif side != "ours-plain":
        raise SystemExit(f"unknown side {side!r}; valid: {', '.join(SIDES)}")
    return overrides


def save_initial_checkpoint(folder: Path, arch: dict[str, Any]) -> Path:
    """The one random initial model every side starts from (fp32 safetensors + the tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(LlamaConfig(**arch, use_cache=False))
    model.save_pretrained(folder)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # every side trains on this GPU while this process waits
    for path in SHIPPED_TOKENIZER.iterdir():
        shutil.copy(path, folder / path.name)
    return folder


def write_train_toml(run_dir: Path, init: Path, docs: Path, args: argparse.Namespace,
                     overrides: dict[str, dict[str, Any]]) -> Path:
    cfg = TrainConfig()
    cfg.model.name, cfg.model.path, cfg.model.tokenizer = "parity", str(init), str(init)
    cfg.model.precision = "bf16" if not args.cpu_smoke else "fp32"
    cfg.data.path, cfg.data.format, cfg.data.tokens_per_micro_batch = str(docs), "tokens", args.budget
    cfg.data.cache_dir = str(run_dir / "cache")
    t = cfg.train
    t.max_steps, t.learning_rate, t.warmup_ratio, t.lr_scheduler_type = args.steps, args.lr, args.warmup_ratio, "cosine"
    t.adam_beta1, t.adam_beta2, t.weight_decay, t.max_grad_norm = 0.9, 0.95, 0.0, 1.0
    t.model_max_length, t.logging_steps, t.save_steps, t.gradient_checkpointing = args.budget, 1, 10**9, False
    cfg.run.dir = str(run_dir)
    return save_train_toml(cfg, run_dir, overrides)


def failed(side: str, run: str, code: int, log_text: str) -> dict[str, Any]:
    """A run that did not finish: its log's tail printed, the reason recorded."""
    print(log_text[-3000:])
    return {"side": side, "run": run, "error": f"timeout {RUN_TIMEOUT_S} s" if code == TIMED_OUT else f"exit {code}"}


def run_ours(side: str, run: str, out: Path, init: Path, docs: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run of one of our sides in OUT/RUN (RUN: the side's name, SIDE.2, ... for its repeats)."""
    run_dir = out / run
    shutil.rmtree(run_dir, ignore_errors=True)  # a run of an earlier call: its metrics.jsonl would be appended to
    toml = write_train_toml(run_dir, init, docs, args, side_overrides(side))
    log = run_dir / "train.log"
    code = run_logged([sys.executable, "-m", "train", "--config", str(toml)], log, RUN_TIMEOUT_S)
    if code != 0:
        return failed(side, run, code, log.read_text(errors="replace"))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "tokens_per_s" in r]
    timing = steady_state(run_dir / "metrics.jsonl") if not args.cpu_smoke else {}
    return {"side": side, "run": run, "losses": losses, "export": str(run_dir / "export"), **timing}


def run_trl(side: str, run: str, out: Path, init: Path, docs: Path, args: argparse.Namespace) -> dict[str, Any]:
    """TRL's side (`trl`: --trl-attn, flex attention by default, our packs; `trl-bfd`: its own packing;
    `trl-sdpa`: SDPA). Its Python stacks go to the log every --stack-every seconds: what it was doing when
    a timeout hit."""
    attn = "sdpa" if side == "trl-sdpa" else args.trl_attn
    command = [sys.executable, "-m", "bench.peers.parity_trl", "--init", str(init), "--data", str(docs),
               "--out", str(out / run), "--steps", str(args.steps), "--max-length", str(args.budget),
               "--lr", str(args.lr), "--warmup-ratio", str(args.warmup_ratio), "--seed", str(TrainConfig().train.seed),
               "--packs", "bfd" if side == "trl-bfd" else "ours",
               "--stack-every", str(args.stack_every), *(["--attn", attn] if attn else [])]
    shutil.rmtree(out / run, ignore_errors=True)
    (out / run).mkdir(parents=True)
    log = out / run / "train.log"
    code = run_logged(command, log, RUN_TIMEOUT_S)
    text = log.read_text(errors="replace")
    if code != 0:
        return failed(side, run, code, text)
    result = json.loads([line for line in text.splitlines() if line.startswith('{"')][-1])
    result.pop("path", None)
    return {"side": side, "run": run, "attention": attn or "default", "packs": "bfd" if side == "trl-bfd" else "ours",
            **result}


def eval_loss(model_dir: str, eval_docs: list[list[int]], batch: int = 16) -> float:
    """Token-weighted mean cross-entropy of `model_dir` over the held-out documents (each its own row,
    padded; every token but the first is predicted): the one score of every side."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").to(device)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        for start in range(0, len(eval_docs), batch):
            rows = eval_docs[start:start + batch]
            width = max(map(len, rows))
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            mask = torch.zeros(len(rows), width, dtype=torch.long)
            for i, row in enumerate(rows):
                ids[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
            ids, mask = ids.to(device), mask.to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            total += float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels.flatten(),
                                                             ignore_index=-100, reduction="sum"))
            count += int((labels != -100).sum())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the next side trains on this GPU
    return total / count


def parity_record(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, shape: str) -> dict[str, Any]:
    """The results record of every side's runs so far (bench/report/parity_record.py: one run flat, repeats pooled)."""
    import torch

    sides = {side: side_entry(side_runs) for side, side_runs in runs.items()}
    return {"shape": shape, "steps": args.steps, "budget": args.budget, "lr": args.lr, "warmup_ratio": args.warmup_ratio,
            "train_docs": args.train_docs,
            "eval_docs": args.eval_docs, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "sides": sides, "comparisons": comparisons(sides)}


def save(record: dict[str, Any], args: argparse.Namespace) -> None:
    """The results file (after every side: a call cut short keeps the sides done) and the plot."""
    stem = f"{record['shape']}-{args.name}" if args.name else record["shape"]
    if args.results:
        write_result(args.results / f"parity-{stem}.json", record)
    plot(record, (args.results or args.out) / f"parity-{stem}.png")


def report(record: dict[str, Any], args: argparse.Namespace) -> None:
    print("\n" + "\n".join(loss_table(record["sides"], args.every)))
    print(f"\n{record['gpu']}, {record['shape']}, {record['steps']} steps x {record['budget']} tokens, lr {record['lr']}, "
          f"same init checkpoint and documents; eval loss = the same scorer on {record['eval_docs']} held-out chats")
    print("\n".join(summary_lines(record)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--sides", default="ours,trl,ours-fp8-fullacc", help=f"comma list of {', '.join(SIDES)}")
    parser.add_argument("--repeat", type=int, default=1, help="run every side N times, in turn (run directories "
                        "SIDE, SIDE.2, ...): its eval loss is their mean, their spread is recorded")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--budget", type=int, default=16384, help="tokens per optimizer step (one packed micro-batch)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-ratio", type=float, default=0.03, help="share of the steps warming the LR up")
    parser.add_argument("--train-docs", type=int, default=0, help="0 = enough for --steps x --budget tokens")
    parser.add_argument("--eval-docs", type=int, default=400)
    parser.add_argument("--trl-attn", default="", help="TRL's attention (bench/peers/parity_trl.py; default flex_attention "
                                                       "on a GPU): on an H100 its first step had not ended after 70 s")
    parser.add_argument("--trl-fallback", action="store_true", help="run trl-sdpa when the trl side fails (and "
                                                                     "instead of trl in the repeats after)")
    parser.add_argument("--stack-every", type=int, default=60, help="TRL's Python stacks to its log every N s (0: off)")
    parser.add_argument("--name", default="", help="results file parity-<shape>[-NAME].json")
    parser.add_argument("--every", type=int, default=10, help="train-loss table: every N steps")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-parity"))
    parser.add_argument("--results", type=Path, default=None, help="folder for the JSON (and the plot)")
    parser.add_argument("--plot", type=Path, default=None, help="only draw the plot of a results JSON")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="FILE",
                        help="only merge results files of one config (e.g. one per GPU) into one record: "
                             "parity-<shape>-<NAME or merged>.json in --results (default: the first file's folder)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU, our plain path (and TRL "
                                                                  "where installed): proves the script runs")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    if args.plot:
        print(plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png")))
    elif args.merge:
        merge_files(args)
    else:
        report(run_sides(args), args)


def run_sides(args: argparse.Namespace) -> dict[str, Any]:
    """Every side --repeat times (repeat 1 of every side, then repeat 2, ...: a call cut short keeps whole
    rounds), the results file rewritten after every run; returns the record."""
    arch, shape = (TINY, "tiny") if args.cpu_smoke else (SHAPES[args.shape], args.shape)
    if args.cpu_smoke:
        args.steps, args.budget, args.eval_docs, args.every = 6, 512, 24, 2
        args.sides = "ours,trl" if _trl_installed() else "ours"
    plan = list(filter(None, args.sides.split(",")))
    if unknown := [side for side in plan if side not in SIDES]:
        usage_error(f"--sides: unknown side {unknown[0]!r}; valid: {', '.join(SIDES)}")
    args.train_docs = args.train_docs or int(1.3 * args.steps * args.budget / 90)  # ~90 tokens a chat
    docs, eval_docs = write_corpus(args.out / "data", args.train_docs, args.eval_docs)
    init = save_initial_checkpoint(args.out / "init", arch)
    runs: dict[str, list[dict[str, Any]]] = {}
    record = parity_record(runs, args, shape)
    for repeat in range(1, args.repeat + 1):
        queue = list(plan)
        while queue:
            side = queue.pop(0)
            run_side = run_trl if side.startswith("trl") else run_ours
            result = run_side(side, run_name(side, repeat), args.out, init, docs, args)
            if side == "trl" and "error" in result and args.trl_fallback:
                if "trl-sdpa" not in plan:
                    queue.insert(0, "trl-sdpa")
                    plan.append("trl-sdpa")
                plan.remove("trl")  # the repeats after: the fallback only
            if "error" not in result:
                result["eval_loss"] = eval_loss(result.pop("export"), eval_docs)
            print(json.dumps({k: v for k, v in result.items() if k != "losses"}), flush=True)
            runs.setdefault(side, []).append(result)
            record = parity_record(runs, args, shape)
            save(record, args)
    return record


def merge_files(args: argparse.Namespace) -> None:
    """--merge: one record of several results files of one config (bench/parity_record.merge), written and
    reported like a run's; a file that is missing, unreadable or of another config: one line, exit 2."""
    paths = [path.resolve() for path in args.merge]
    if len(set(paths)) < len(paths):
        usage_error("--merge: a file is named twice (its runs would count twice)")
    common = Path(os.path.commonpath([path.parent for path in paths]))
    records = []
    for path in paths:  # each named by its path below the files' common folder: gpu0/parity-x.json, ...
        try:
            records.append((str(path.relative_to(common)), json.loads(path.read_text())))
        except (OSError, ValueError) as error:
            usage_error(f"--merge: {path}: {error}")
    try:
        record = merge(records)
    except ValueError as error:
        usage_error(f"--merge: {error}")
    args.results, args.name = args.results or paths[0].parent, args.name or "merged"
    target = (args.results / f"parity-{record['shape']}-{args.name}.json").resolve()
    if target in paths:
        usage_error(f"--merge: the merged record would overwrite its input {target}; give another --name")
    save(record, args)
    report(record, args)
    print(f"merged {len(paths)} files into {target}")


def usage_error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _trl_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("trl") is not None


if __name__ == "__main__":
    main()
