"""QLoRA on GPUs (issue #26): one call per part, a table printed last and one JSON per run.

    python -m bench.multi.gpu_qlora single --results bench/results/h100     # 1 GPU: 8B ours vs TRL + PEFT QLoRA
    python -m bench.multi.gpu_qlora match --results bench/results/h100      # 2 GPUs vs 1 GPU, same job: loss curves
    python -m bench.multi.gpu_qlora llama70b --results bench/results/h100   # llama-70b shape on 2 GPUs, peak vs plan
    python -m bench.multi.gpu_qlora llama70b --gpus 1 --steps 14 --results bench/results/h200  # on one GPU (#64)
    python -m bench.multi.gpu_qlora llama70b --gpus 1 --budget 4096 --checkpoint-layers 58 --results DIR  # 58 of 80
    python -m bench.multi.gpu_qlora llama70b --lora-bf16 --gpus 4 --docs 300 --budget 2048 --steps 22 \
        --results bench/results/h100                                  # the same shape, bf16 LoRA on 4 GPUs
    python -m bench.multi.gpu_qlora llama70b --lora-bf16 --gpus 4 --cpu-smoke  # tiny shape on CPU (gloo)
    python -m bench.multi.gpu_qlora match --cpu-smoke                       # tiny shape on CPU (gloo): the script runs

`single` runs bench/suites/gpu_single.py's `ours-qlora` variant and the `trl-qlora` peer (bitsandbytes NF4,
double quantization, bf16 compute and storage; LoRA r 16 on every linear layer, no dropout, no
checkpointing) on the same documents. `match` and `llama70b` run what users run: the run directory
`sft-launch --executor local` renders (FSDP2 accelerate.yaml from the launcher's template, train.toml;
render_run), started with the local executor's own command; the model is random (built per
module on the meta device and quantized as it is drawn: a 140 GB checkpoint does not fit the disk).
`match` and `llama70b` write `qlora-1gpu-vs-2gpu.json` / `qlora-llama70b-2gpu.json` through
bench/report/results_io.py (provenance; raw `real_tokens`/`seconds` after the warm-up; the 70B run's MFU at
4·N + 6·N_lora and its peak against the planner's), re-derived by tests/bench/test_results.py.

`llama70b --lora-bf16` (issue #26: bf16 LoRA on 4 GPUs, >= 20 steps, MFU): the base in bf16, no
quantization; the random model can no longer be built whole on every rank (140 GB per rank on the CPU),
so the run uses `model.init = "sharded"` (train/engine/sharded_init.py: built on meta, each rank draws its
FSDP2 shards on its GPU). Eager (compile off): the compiled 70B layers of the QLoRA run did not finish
in a time-limited call. 300 documents at 2048 tokens pack into 105 micro-batches: 26 steps of 4 GPUs in
one epoch. Writes `lora-bf16-llama70b-<N>gpu.json` (no peer: `peer` "none").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.suites import gpu_single
from bench.multi.host import toml_inline, write_run_dir
from bench.common.processes import TIMED_OUT, run_logged
from bench.report.results_io import throughput_numbers, write_result
from bench.common.synthetic import LLAMA_1B, document_lengths, write_token_jsonl
from contract.config import LoraSection, load_train_config
from contract.gpus import gpu_type_from_device_name
from contract import protocol
from contract.protocol import free_port
from contract.shape import ModelShape
from launcher.execute.local import train_command

LLAMA_70B = dict(  # the llama-70b preset (Llama-2-70B shape)
    hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
    intermediate_size=28672, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096,
)
QLORA = {"lora": {"enabled": True, "quant": "nf4", "dropout": 0.0}}  # no dropout: 1 and 2 GPUs draw no masks
# bf16 LoRA on the llama-70b shape: no NF4; a random model drawn per shard (no rank holds it whole)
LORA_BF16 = {"lora": {"enabled": True, "quant": "none", "dropout": 0.0}, "model": {"init": "sharded"}}
# --cpu-smoke: every target weight a multiple of 64 x 256 elements per rank (train/engine/qlora.py)
PROFILE = """[profiles.bench]
gpus_per_node = {gpus}
processes_per_node = {processes}
backend = "{backend}"
partition = ""
storage_root = "{root}"
strategy = "fsdp"
time = "1:00:00"
"""  # one node; no gpu_type: train.toml's run.gpu_type stays "" and the run names its GPU itself, as before
TINY_QLORA = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=512, vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=4096)


def render_run(name: str, out: Path, data: Path, arch: dict, budget: int, processes: int,
               overrides: dict[str, dict[str, Any]]) -> Any:
    """The run directory `sft-launch --executor local` writes for this job on a one-node profile of
    `processes` GPUs (CPU processes over gloo under --cpu-smoke): accelerate.yaml from the launcher's
    template, train.toml with gpu_single's benchmark settings as --set flags. Returns the Launch."""
    cpu = bool(os.environ.get("BENCH_CPU"))
    cluster = out / f"{name}.cluster.toml"
    cluster.write_text(PROFILE.format(gpus=0 if cpu else processes, processes=processes,
                                      backend="gloo" if cpu else "nccl", root=out))
    settings = gpu_single.bench_settings(data, arch, budget, overrides)
    sets = [f"{section}.{key}={toml_inline(value) if isinstance(value, dict) else json.dumps(value)}"
            for section, values in settings.items() for key, value in values.items() if f"{section}.{key}" != "data.path"]
    return write_run_dir(["--executor", "local", "--cluster", str(cluster), "--profile", "bench", "--model", "tiny",
                          "--data", str(data), "--output", str(out / name), *[w for s in sets for w in ("--set", s)]])


def launch(name: str, out: Path, data: Path, arch: dict, budget: int, processes: int,
           overrides: dict[str, dict[str, Any]], devices: str | None = None) -> dict[str, Any]:
    """One run as `sft-launch --executor local` starts it (on CUDA_VISIBLE_DEVICES=`devices` if given);
    its metrics as a result row."""
    run_dir = out / name
    attempt = protocol.local_attempt_name(time.time())  # each rank's whole output: logs/ranks/<attempt>/
    command = train_command(render_run(name, out, data, arch, budget, processes, overrides), free_port(), attempt)
    log = run_dir / "train.log"
    env = {**os.environ, "OMP_NUM_THREADS": "4", **({"CUDA_VISIBLE_DEVICES": devices} if devices else {})}
    code = run_logged(command, log, gpu_single.RUN_TIMEOUT_S, env)
    text = log.read_text() + "".join(p.read_text() for p in sorted(
        Path(protocol.rank_logs_dir(str(run_dir), attempt)).glob("rank-*.log")))
    if code == TIMED_OUT:
        return {"path": name, "error": f"timeout {gpu_single.RUN_TIMEOUT_S} s"}
    if code != 0:
        print(text[-4000:])
        return {"path": name, "error": f"exit {code}"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    return {"path": name, "gpu_count": processes, **gpu_single.steady_state(run_dir / "metrics.jsonl"),
            "losses": {r["step"]: r["loss"] for r in steps}, "grad_norms": {r["step"]: r["grad_norm"] for r in steps},
            "tokens_per_s_per_gpu": steps[-1].get("tokens_per_s_per_gpu"), "mfu_last": steps[-1].get("mfu"),
            "load_log": [line for line in text.splitlines() if any(k in line for k in LOAD_LINES)][:6]}


LOAD_LINES = ("peak RSS", "NF4", "per shard")  # how each rank loaded or drew its weights (train/engine/)


def data_for(out: Path, docs: int, budget: int, vocab: int) -> tuple[Path, list[int]]:
    lengths = document_lengths(docs, budget)
    path = out / "docs.jsonl"
    write_token_jsonl(path, lengths, vocab)
    return path, lengths


def qlora_job(args: argparse.Namespace, arch: dict, logging_steps: int,
              learning_rate: float) -> tuple[dict, Path, dict[str, Any]]:
    """(arch, documents, [train] overrides) of a multi-process QLoRA run: checkpointing (--checkpoint-layers),
    compile auto."""
    arch = TINY_QLORA if args.cpu_smoke else arch
    data, _ = data_for(args.out, args.docs, args.budget, arch["vocab_size"])
    return arch, data, {"max_steps": args.steps, "logging_steps": logging_steps, "learning_rate": learning_rate,
                        "compile": "auto", **checkpointing(args.checkpoint_layers)}


def checkpointing(layers: str) -> dict[str, Any]:
    """--checkpoint-layers as train.toml keys: "all", a number of layers, or "none" (no checkpointing)."""
    if layers == "none":
        return {"gradient_checkpointing": False}
    return {"gradient_checkpointing": True, "checkpoint_layers": layers if layers == "all" else int(layers)}


def part_single(args: argparse.Namespace) -> list[dict[str, Any]]:
    """8B QLoRA on one GPU: ours vs TRL + PEFT + bitsandbytes, same documents."""
    shape = "llama3-8b"
    data, lengths = data_for(args.out, args.docs, args.budget, gpu_single.SHAPES[shape]["vocab_size"])
    results = [gpu_single.run_peer("trl-qlora", args.out, data, shape, args.budget)]
    print(json.dumps(results[-1]), flush=True)
    for variant in ("ours-qlora-nocompile", "ours-qlora"):
        results.append(gpu_single.run_ours(variant, args.out, data, gpu_single.SHAPES[shape], args.budget))
        print(json.dumps(results[-1]), flush=True)
    args.shape = shape
    gpu_single.report(results, gpu_single.SHAPES[shape], lengths, args)
    return results


def part_match(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same QLoRA job on 2 GPUs (FSDP2) and on 1 GPU with twice the accumulation: loss per step. Both
    eager (the 2-rank default; compiled layers would add a compiled-vs-eager difference), run at the same
    time (the one-GPU run on the second GPU): a correctness check, its throughputs are shared-GPU numbers."""
    arch, data, train = qlora_job(args, LLAMA_1B, logging_steps=1, learning_rate=2e-4)
    train["compile"] = False
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        two_f = pool.submit(launch, "qlora-2gpu", args.out, data, arch, args.budget, 2, {**QLORA, "train": train})
        one_f = pool.submit(launch, "qlora-1gpu", args.out, data, arch, args.budget, 1,
                            {**QLORA, "train": {**train, "gradient_accumulation_steps": 2}}, devices="1")
        two, one = two_f.result(), one_f.result()
    result = {"path": "qlora-1gpu-vs-2gpu", "shape": "tiny" if args.cpu_smoke else "llama3.2-1b", "docs": args.docs,
              "budget": args.budget, "steps": args.steps, "two": two, "one": one}
    if "error" not in one and "error" not in two:
        result |= loss_match(one, two)
    print("| run | steps | first loss | last loss | max |loss diff| | max grad-norm rel diff |\n|---|---|---|---|---|---|")
    for row in (two, one):
        if "error" in row:
            print(f"| {row['path']} | error: {row['error']} | | | | |")
        else:
            losses = list(row["losses"].values())
            print(f"| {row['path']} | {len(losses)} | {losses[0]:.4f} | {losses[-1]:.4f} | "
                  f"{result.get('max_loss_diff', float('nan')):.2e} | {result.get('max_grad_norm_rel_diff', float('nan')):.2e} |")
    write(args, result)
    return [result]


def loss_match(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """Step-for-step agreement of two runs' logged losses (target 1e-2) and gradient norms."""
    if one["losses"].keys() != two["losses"].keys():
        return {"met": False, "mismatch": f"steps {sorted(one['losses'])} vs {sorted(two['losses'])}"}
    loss = max(abs(one["losses"][s] - two["losses"][s]) for s in two["losses"])
    grad = max(abs(one["grad_norms"][s] - two["grad_norms"][s]) / abs(two["grad_norms"][s]) for s in two["grad_norms"])
    return {"max_loss_diff": loss, "max_grad_norm_rel_diff": grad, "target": 1e-2, "met": loss <= 1e-2}


def planned(arch: dict, gpus: int, budget: int, gpu_type: str, quant: str = "nf4",
            layers: str = "all", compiled: bool = False) -> dict[str, float]:
    """What the planner predicts for the llama-70b run (GiB per GPU); `compiled`: its decoder layers compile."""
    from contract.shape import FUSED_LOSS_CHUNK_TOKENS
    from launcher.plan.planner import PlanInput, make_plan

    plan = make_plan(PlanInput(arch=arch, nodes=1, gpus_per_node=gpus, gpu_type=gpu_type, lora=True, quant=quant,
                               micro_batch_tokens=budget, **checkpointing(layers), compile=compiled,
                               loss_chunk_tokens=FUSED_LOSS_CHUNK_TOKENS, max_steps=20))
    gib = 2**30
    return {"allocated_gib": plan.gpu.allocated / gib, "reserved_gib": plan.gpu.reserved / gib,
            "total_gib": plan.gpu.total / gib, "peak_phase": plan.gpu.peak_phase, "verdict": plan.verdict}


def part_llama70b(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The llama-70b shape: QLoRA on 2 GPUs, or (--lora-bf16) bf16 LoRA on --gpus; peak against the plan."""
    arch, data, train = qlora_job(args, LLAMA_70B, logging_steps=2, learning_rate=1e-4)
    gpus, quant = args.gpus, "none" if args.lora_bf16 else "nf4"
    if args.lora_bf16:
        name, overrides = f"lora-bf16-llama70b-{gpus}gpu", {**LORA_BF16, "train": {**train, "compile": False}}
    else:
        name, overrides = f"qlora-llama70b-{gpus}gpu", {**QLORA, "train": train}
    row = launch(name, args.out, data, arch, args.budget, gpus, overrides)
    row |= {"shape": "tiny" if args.cpu_smoke else "llama-70b", "arch": arch, "budget": args.budget,
            "docs": args.docs, **checkpointing(args.checkpoint_layers)}
    gpu, peak = gpu_single.device_peak()
    compiled = load_train_config(args.out / name / "train.toml").compiles_decoder_layers(True, gpus)  # as on the GPU
    row["plan"] = planned(arch, gpus, args.budget, gpu_type_from_device_name(gpu) or "h100", quant,  # the GPU it ran on
                          args.checkpoint_layers, compiled)
    if "error" not in row:
        adapters = ModelShape.from_arch(arch).lora_params(LoraSection().r, LoraSection().target_modules)
        row |= {"gpu": gpu, "peak_flops": peak, "lora_params": adapters, "peer": "none", "ratio_vs_peer": None,
                **throughput_numbers(arch, document_lengths(args.docs, args.budget), row["real_tokens_per_s"], gpus,
                                     peak, adapters)}
        measured, predicted = row["peak_mem_gib"] or 0.0, row["plan"]["allocated_gib"]
        row["plan_error"] = (predicted - measured) / measured if measured else None
        error = "n/a" if row["plan_error"] is None else f"{row['plan_error']:+.1%}"
        mfu = "n/a" if row["mfu"] is None else f"{row['mfu']:.1%}"
        print(f"| run | steps | real tokens/s/GPU | MFU | last loss | peak GiB (allocated) | plan GiB | plan error |\n"
              f"|---|---|---|---|---|---|---|---|\n| {row['path']} | {len(row['losses'])} | "
              f"{row['real_tokens_per_s'] / gpus:,.0f} | {mfu} | {list(row['losses'].values())[-1]:.4f} | {measured:.2f} | "
              f"{predicted:.2f} | {error} |")
    else:
        print(f"| {row['path']} | error: {row['error']} |")
    write(args, row)
    return [row]


def write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """One results file `<path>.json` (qlora-…, lora-bf16-…) through bench/report/results_io.py (provenance), also on
    failure."""
    if args.results:
        write_result(args.results / f"{result['path']}.json", result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=("single", "match", "llama70b"))
    parser.add_argument("--docs", type=int, default=400)
    parser.add_argument("--budget", type=int, default=8192, help="packed tokens per micro-batch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-qlora"))
    parser.add_argument("--results", type=Path, default=None, help="folder for one JSON per run")
    parser.add_argument("--gpus", type=int, default=2, help="llama70b: GPUs (processes) of the one node")
    parser.add_argument("--lora-bf16", action="store_true", help="llama70b: bf16 LoRA (no NF4), model.init = sharded")
    parser.add_argument("--checkpoint-layers", default="all",
                        help="train.checkpoint_layers: all, a number of decoder layers, or none (no checkpointing)")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    if args.cpu_smoke:
        os.environ["BENCH_CPU"] = "1"
        args.docs, args.budget, args.steps = 96, 512, 4
    {"single": part_single, "match": part_match, "llama70b": part_llama70b}[args.part](args)


if __name__ == "__main__":
    main()
