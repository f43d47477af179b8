"""One-GPU benchmark: the peers (FastChat-style Trainer, TRL's SFTTrainer tuned for speed) and our
train package on the same documents, in the same run.

    python -m bench.suites.gpu_single --shape llama3.2-1b --docs 800 --peers trl --variants ours   # 3 runs a side
    python -m bench.suites.gpu_single --repeat 1 --shape llama3.2-1b --docs 800 --peers fastchat,trl,trl-compile
    python -m bench.suites.gpu_single --repeat 1 --shape llama3-8b --budget 8192 --variants ours-lora --peers trl-lora
    python -m bench.suites.gpu_single --cpu-smoke          # tiny shape on CPU: proves the script runs

Every side (ours and each peer) trains one epoch over the same synthetic documents
(bench/common/synthetic.py). Throughput is real (non-padding) tokens per second over the optimizer steps
after the same WARMUP_STEPS (bench/report/results_io.py) on every side, on a wall clock that stops when the
last step's GPU work is done (no model build, no Trainer teardown, no export). What still differs
between the sides is what a step is: ours and TRL pack up to --budget tokens per step, the
FastChat-style peer takes 8 padded documents, so the warm-up steps cover different documents and the
counted `real_tokens` differ (each file records its own). MFU uses contract.shape's FLOP count for
both sides. Prints a table last and writes one JSON file per run through bench/report/results_io.py.

A figure of ours against a peer is a distribution (issue #51): --repeat N (default 3) runs one peer and one
variant N times each, alternating from the peer, re-runs a peer run more than 15% below the peer's median,
and writes every run (the peer's step times, ours' logged windows) with the median ratio and its range into
one compare-<shape>-<variant>-vs-peer-<peer>.json (bench/report/distribution.py). --repeat 1 is the
one-run-a-side table of several peers and variants (single-*.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import tomli_w

from bench.common.processes import TIMED_OUT, run_logged
from bench.common.synthetic import SHAPES, document_lengths, write_token_jsonl
from bench.common.variants import VARIANTS
from bench.report import distribution
from bench.report.results_io import WARMUP_STEPS, clock_start, throughput_numbers, write_result
from contract.gpus import gpu_type_from_device_name, lookup
from contract.protocol import LOGS_DIR, PROFILE_DIR
from contract.schema import to_dict
from contract.config import TrainConfig
from contract.shape import LORA_TARGETS, ModelShape

ROOT = Path(__file__).resolve().parents[2]
LOGGING_STEPS = 4  # the loop reads GPU numbers only when it logs (one host sync per log line)
assert WARMUP_STEPS % LOGGING_STEPS == 0, "the clock starts at a logged step: warm-up = whole logging windows"
RUN_TIMEOUT_S = int(os.environ.get("BENCH_RUN_TIMEOUT_S", "900"))  # one stuck run must not eat the others' time
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=4096)

# Peers: name -> command-line arguments of their script.
PEERS: dict[str, list[str]] = {
    "fastchat": ["-m", "bench.peers.peer_fastchat"],
    "trl": ["-m", "bench.peers.peer_trl"],
    "trl-compile": ["-m", "bench.peers.peer_trl", "--compile"],
    "trl-lora": ["-m", "bench.peers.peer_trl", "--lora"],
    "trl-lora-compile": ["-m", "bench.peers.peer_trl", "--lora", "--compile"],
    "trl-qlora": ["-m", "bench.peers.peer_trl", "--qlora"],
}


def bench_settings(data: Path, arch: dict, budget: int, overrides: dict) -> dict[str, dict[str, Any]]:
    """train.toml's settings of a benchmark run (section -> key -> value), `overrides` applied: a random
    model from `arch`, the token documents `data` packed `budget` tokens to a micro-batch, one epoch,
    no checkpoint, no export."""
    settings: dict[str, dict[str, Any]] = {
        "model": {"name": "bench", "path": "", "arch": dict(arch),
                  "precision": "bf16" if not os.environ.get("BENCH_CPU") else "fp32"},
        "data": {"path": str(data), "format": "tokens", "tokens_per_micro_batch": budget},
        "train": {"num_train_epochs": 1.0, "logging_steps": LOGGING_STEPS, "save_steps": 10**9,
                  "learning_rate": 2e-5, "warmup_ratio": 0.03, "model_max_length": budget},
        "run": {"export_dir": ""}}
    for section, values in overrides.items():
        settings[section] = {**settings.get(section, {}), **values}
    return settings


def write_train_toml(run_dir: Path, data: Path, arch: dict, budget: int, overrides: dict) -> Path:
    cfg = TrainConfig()
    cfg.data.cache_dir, cfg.run.dir = str(run_dir / "cache"), str(run_dir)
    return save_train_toml(cfg, run_dir, bench_settings(data, arch, budget, overrides))


def save_train_toml(cfg: TrainConfig, run_dir: Path, overrides: dict[str, dict[str, Any]]) -> Path:
    """run_dir/train.toml of `cfg` with the overrides (section -> key -> value) applied."""
    for section, values in overrides.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "train.toml"
    path.write_bytes(tomli_w.dumps(to_dict(cfg)).encode())
    return path


def steady_state(metrics: Path) -> dict[str, Any]:
    """Aggregate the logged windows after the warm-up (results_io.clock_start): real tokens and wall
    seconds summed over the windows (an aggregate, not a mean of per-window rates)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    # (previous record, current record): the current window's duration is the elapsed_s difference.
    start = clock_start(r["step"] for r in steps)
    timed = [(prev, cur) for prev, cur in zip(steps, steps[1:]) if prev["step"] >= start]
    seconds = sum(cur["elapsed_s"] - prev["elapsed_s"] for prev, cur in timed)
    tokens = round(sum(cur["tokens_per_s"] * (cur["elapsed_s"] - prev["elapsed_s"]) for prev, cur in timed))
    return {
        "real_tokens": tokens, "seconds": seconds, "warmup_steps": start,
        "real_tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "peak_mem_gib": max((r.get("peak_mem_gib") or 0.0) for r in steps),
        "steps": timed[-1][1]["step"] - timed[0][0]["step"] if timed else 0,
        "final_loss": steps[-1]["loss"],
        # Graphs compiled after the first logged window: recompilations that stalled every rank.
        "recompiles_after_first_log": steps[-1].get("compiled_graphs", 0) - steps[0].get("compiled_graphs", 0),
    }


def windows(metrics: Path) -> list[dict[str, Any]]:
    """Each logged window's step, duration, throughput, MFU, compiled-graph count, the allocator's state
    (peak reserved GiB, free-and-retry passes so far: memory pressure shows there), the seconds Python's
    garbage collection took in it and its slowest step (number, seconds), from metrics.jsonl."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    previous = [0.0] + [r["elapsed_s"] for r in steps[:-1]]
    return [{"step": r["step"], "seconds": r["elapsed_s"] - before, "tokens_per_s": r["tokens_per_s"],
             "mfu": r.get("mfu"), "compiled_graphs": r.get("compiled_graphs", 0),
             "peak_reserved_gib": r.get("peak_reserved_gib"), "alloc_retries": r.get("alloc_retries"),
             "gc_s": r.get("gc_s"), "slowest_step": r.get("slowest_step"), "slowest_step_s": r.get("slowest_step_s")}
            for r, before in zip(steps, previous)]


# What train.log says ran (train/kernels/attention.py, train/engine/model.py): name -> pattern of the line's rest.
KERNEL_LINES = {"attention": r"attention: (\w+ for packed batches.*)", "fused_loss": r"fused loss (.+)",
                "fused_mlp": r"fused SwiGLU MLP (.+)"}


def kernels_in_log(text: str) -> dict[str, Any]:
    """The kernel choices our run logged (first line of each kind), and the attention backend's name."""
    found = {name: m.group(1).strip() for name, pattern in KERNEL_LINES.items() if (m := re.search(pattern, text))}
    backend = re.search(r"attention: (\w+) for packed batches", text)
    return {"attention": backend.group(1) if backend else "not logged", "kernels": found}


def profile_record(run_dir: Path, name: str, spec: str) -> dict[str, Any] | None:
    """GPU time by kind of the profiled steps (train/observe/profiling.py's breakdown of the run's trace)."""
    from train.observe.profiling import kernel_breakdown, read_trace

    traces = sorted((run_dir / LOGS_DIR / PROFILE_DIR).glob("*.trace.json"))
    if not traces:
        return None
    return {"path": name, "profile_steps": spec, **kernel_breakdown(read_trace(traces[-1]))}


def run_ours(name: str, out: Path, data: Path, arch: dict, budget: int, profile: str = "") -> dict[str, Any]:
    run_dir = out / name
    overrides = {**VARIANTS[name], "train": {**VARIANTS[name].get("train", {}),
                                             **({"profile_steps": profile} if profile else {})}}
    toml = write_train_toml(run_dir, data, arch, budget, overrides)
    log = run_dir / "train.log"
    code = run_logged([sys.executable, "-m", "train", "--config", str(toml)], log, RUN_TIMEOUT_S, dict(os.environ))
    if code == TIMED_OUT:
        return {"path": name, "error": f"timeout {RUN_TIMEOUT_S} s"}
    if code != 0:
        print(log.read_text()[-3000:])
        return {"path": name, "error": f"exit {code}"}
    result = {"path": name, **steady_state(run_dir / "metrics.jsonl"), **kernels_in_log(log.read_text())}
    if profile:
        result["_profile"] = profile_record(run_dir, name, profile)
    return result


def run_peer(name: str, out: Path, data: Path, shape: str, budget: int) -> dict[str, Any]:
    command = [sys.executable, *PEERS[name], "--data", str(data), "--shape", shape, "--out", str(out / name)]
    if name.startswith("trl"):
        command += ["--max-length", str(budget)]
    stdout, stderr = out / f"peer-{name}.out", out / f"peer-{name}.err"
    code = run_logged(command, stdout, RUN_TIMEOUT_S, dict(os.environ), errors=stderr)
    if code == TIMED_OUT:
        return {"path": f"peer-{name}", "error": f"timeout {RUN_TIMEOUT_S} s"}
    if code != 0:
        print(stdout.read_text()[-2000:], stderr.read_text()[-3000:])
        return {"path": f"peer-{name}", "error": f"exit {code}"}
    return json.loads(stdout.read_text().strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--docs", type=int, default=1200)
    parser.add_argument("--budget", type=int, default=32768, help="packed tokens per micro-batch")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--peers", default="fastchat", help=f"comma list of {', '.join(PEERS)}")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-single"))
    parser.add_argument("--results", type=Path, default=None, help="folder for one JSON per run")
    parser.add_argument("--profile", default="", help='kernel profile of our runs\' steps, e.g. "2:4" (inside the '
                        'warm-up, so the clocked steps run unprofiled): in train.log and, with --results, a '
                        'profile-*.json file of GPU time by kind')
    parser.add_argument("--repeat", type=int, default=distribution.RUNS_PER_SIDE,
                        help="runs a side of one peer against one variant, alternating, into one compare-*.json "
                        "(bench/report/distribution.py); 1: every peer and variant once, one single-*.json each")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    if args.repeat > 1 and not args.cpu_smoke and (args.no_peer or len(args.peers.split(",")) != 1
                                                   or len(args.variants.split(",")) != 1):
        parser.error(f"--repeat {args.repeat} compares one peer with one variant (--peers P --variants V); "
                     "--repeat 1 runs several once each")
    arch = TINY if args.cpu_smoke else SHAPES[args.shape]
    if args.cpu_smoke:
        os.environ["BENCH_CPU"] = "1"
        args.docs, args.budget, args.no_peer = 64, 2048, True
        args.variants = os.environ.get("BENCH_SMOKE_VARIANTS", "ours-nocompile")
    lengths = document_lengths(args.docs, args.budget)
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, lengths, arch["vocab_size"])
    peers = [] if args.no_peer else [p for p in args.peers.split(",") if p]
    gpu, peak = device_peak()
    if args.repeat > 1 and not args.cpu_smoke:
        compare(args, data, arch, lengths, gpu, peak)
        return
    results = []
    for name in peers:
        results.append(run_peer(name, args.out, data, args.shape, args.budget))
        print(json.dumps(results[-1]), flush=True)
    ok = [r for r in results if "error" not in r]
    peer = max(ok, key=lambda r: r["real_tokens_per_s"], default=None)  # the fastest peer of this call
    # Each file is written as soon as its numbers are final (the peers' once all peers ran, ours as each
    # run lands), so a call cut off by its time limit keeps what it finished.
    rows = [finish(r, peer, arch, lengths, args, gpu, peak) for r in results]
    for name in args.variants.split(","):
        result = run_ours(name, args.out, data, arch, args.budget, args.profile)
        print(json.dumps({k: v for k, v in result.items() if k != "_profile"}), flush=True)
        rows.append(finish(result, peer, arch, lengths, args, gpu, peak))
    mean_doc = sum(n * n for n in lengths) / sum(lengths)
    print(f"\n{gpu}, {len(lengths)} docs, {sum(lengths):,} real tokens, mean attended length {mean_doc:.0f}, "
          f"{WARMUP_STEPS} warm-up steps skipped on every side")
    best = f" (vs peer = vs {peer['path']}, the fastest peer of this run)" if peer else ""
    print(f"| path | real tokens/s | MFU | peak GiB | vs peer{best} |\n|---|---|---|---|---|")
    print("\n".join(rows))


def finish(r: dict, peer: dict | None, arch: dict, lengths: list[int], args: argparse.Namespace, gpu: str,
           peak: float | None) -> str:
    """Add the derived numbers to one run's result, write its file(s) with --results; its table row."""
    profile = r.pop("_profile", None)
    if "error" in r:
        return f"| {r['path']} | error: {r['error']} | | | |"
    shape = args.shape if not args.cpu_smoke else "tiny"
    # LoRA sides (ours-lora, trl-lora*): r 16 on every linear layer on both, as configured above
    adapters = ModelShape.from_arch(arch).lora_params(16, LORA_TARGETS) if "lora" in r["path"] else None
    r.update(gpu=gpu, gpu_count=1, peak_flops=peak, shape=shape, budget=args.budget,
             total_real_tokens=sum(lengths), docs=len(lengths), **({"lora_params": adapters} if adapters else {}),
             **throughput_numbers(arch, lengths, r["real_tokens_per_s"], 1, peak, adapters))
    if peer:
        r.update(peer=peer["path"], peer_real_tokens_per_s=peer["real_tokens_per_s"],
                 ratio_vs_peer=r["real_tokens_per_s"] / peer["real_tokens_per_s"])
    if args.results:
        write_result(args.results / f"single-{shape}-{r['path']}.json", r)
        if profile:
            write_result(args.results / f"profile-{shape}-{r['path']}.json",
                         {**profile, "gpu": gpu, "shape": shape, "budget": args.budget, "docs": len(lengths),
                          "attention": r["attention"], "kernels": r["kernels"]})
    mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "n/a"
    ratio = f"{r.get('ratio_vs_peer', 0):.2f}x" if peer else "-"
    return f"| {r['path']} | {r['real_tokens_per_s']:,.0f} | {mfu} | {r['peak_mem_gib'] or 0:.1f} | {ratio} |"


def compare(args: argparse.Namespace, data: Path, arch: dict, lengths: list[int], gpu: str, peak: float | None) -> None:
    """One peer against one variant of ours, --repeat runs a side alternating, every run recorded with its
    step times (the peer's per step, ours' per logged window), the median ratio and its range: one
    compare-<shape>-<variant>-vs-peer-<peer>.json (bench/report/distribution.py)."""
    peer_name, ours_name = args.peers, args.variants
    checkpointing = {"ours": VARIANTS[ours_name]["train"]["gradient_checkpointing"], "peer": peer_name == "fastchat"}

    def measured(r: dict[str, Any]) -> dict[str, Any]:
        adapters = ModelShape.from_arch(arch).lora_params(16, LORA_TARGETS) if "lora" in r["path"] else None
        if "error" not in r:
            r.update(**({"lora_params": adapters} if adapters else {}),
                     **throughput_numbers(arch, lengths, r["real_tokens_per_s"], 1, peak, adapters))
        print(json.dumps({k: v for k, v in r.items() if k not in ("windows", "step_seconds")}), flush=True)
        return r

    def ours(index: int) -> dict[str, Any]:
        r = run_ours(ours_name, args.out / f"ours-{index}", data, arch, args.budget)
        if "error" not in r:
            r["windows"] = windows(args.out / f"ours-{index}" / ours_name / "metrics.jsonl")
        return measured(r)

    def peer(index: int) -> dict[str, Any]:
        (args.out / f"peer-{index}").mkdir(parents=True, exist_ok=True)
        return measured(run_peer(peer_name, args.out / f"peer-{index}", data, args.shape, args.budget))

    record = {"shape": args.shape, "budget": args.budget, "docs": len(lengths), "total_real_tokens": sum(lengths),
              "gpu": gpu, "gpu_count": 1, "peak_flops": peak,
              **distribution.compare(args.repeat, peer, ours,
                                     {"path": ours_name, "gradient_checkpointing": checkpointing["ours"]},
                                     {"path": f"peer-{peer_name}", "gradient_checkpointing": checkpointing["peer"]})}
    if peer_name == "fastchat":  # the peer a FastChat user runs, as its train.py configures it
        record["difference_reason"] = "FastChat-style peer: padded batches of 8 documents, activation checkpointing"
    if args.results:
        write_result(args.results / f"compare-{args.shape}-{ours_name}-vs-peer-{peer_name}.json", record)
    if record["ratio_median"] is not None:
        print(f"\n{gpu}: {ours_name} / peer-{peer_name}, real tokens/s: {distribution.ratio_cell(record)}, "
              f"runs in order {' '.join(record['order'])}")


def device_peak() -> tuple[str, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    name = torch.cuda.get_device_name()
    spec = lookup(gpu_type_from_device_name(name) or "")
    return name, spec.peak_tflops_bf16 * 1e12 if spec else None


if __name__ == "__main__":
    main()
