"""8B LoRA on several GPUs of one host: ours against TRL + PEFT under FSDP2 (issue #29 item 3).

    python -m bench.multi.gpu_multi_lora --gpus 2 --repeat 3 --results bench/results/h200/…   # multi-<gpus>gpu-8b-lora.json
    BENCH_CPU_SMOKE=1 python -m bench.multi.gpu_multi_lora --gpus 2 --no-peer        # tiny shape on CPU: ours only

Same documents (bench/common/synthetic.py), same tokens per GPU (--budget per micro-batch per rank), same number
of optimizer steps, the same WARMUP_STEPS skipped on both sides, random weights on both (model.path "").
- Ours: rendered by `sft-launch` and started as a 2-machine job (bench/multi/gpu_multi.py): FSDP2, LoRA r 16 on
  every linear layer, no dropout, compiled layers, no activation checkpointing, the random weights drawn
  per shard on the GPUs (model.init = sharded; a CPU draw of 8B on every rank took > 155 s on 4 H100s).
- Peer: `accelerate launch` (FSDP2, bf16, LlamaDecoderLayer wrap, as templates/accelerate.yaml.j2 renders
  it) of bench/peers/peer_trl.py --lora: SFTTrainer with BFD padding-free packing, flex attention, Liger, fused
  AdamW, PEFT LoRA r 16 / alpha 32 / dropout 0 on all linear layers, bf16 base.
MFU counts the frozen base at 4·N + 6·N_lora (contract.shape) on both sides.
--repeat N (default 3; 1 with --no-peer or on CPU) runs each side N times alternating from the peer, a peer run
more than 15% below the peer's median once more, and records every run (ours' logged windows, the peer's step
times) under `sides` with the median ratio and its range (bench/report/distribution.py); --repeat 1 writes one
run a side under `8b_lora_peer` / `8b_lora`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.multi import host
from bench.multi.multi_full import compare_rows, numbered
from bench.suites.gpu_single import RUN_TIMEOUT_S, device_peak, windows
from bench.common.processes import TIMED_OUT
from bench.peers.peer_fsdp import run_peer
from bench.report import distribution
from bench.report.results_io import throughput_numbers, write_result
from bench.common.synthetic import sample_lengths, write_token_jsonl
from contract.shape import LORA_TARGETS, ModelShape

SHAPE, LORA_R = "llama3-8b", 16


def ours(args: argparse.Namespace, data: Path, arch: dict, index: int | None = None) -> dict[str, Any] | str:
    run = args.out / numbered("ours-lora", index)
    host.render(run, SHAPE, data, args.gpus, [
        "--lora", "--max_steps", str(args.steps), "--save_steps", "1000000", "--gradient_checkpointing", "false",
        *host.random_weights(arch, sharded=True),
        "--set", "lora.dropout=0.0", "--set", f"data.tokens_per_micro_batch={args.budget}",
        "--set", f"train.compile={str(not host.CPU_SMOKE).lower()}"])
    code, text = host.launch(run, args.gpus, 29630 + (index or 0), RUN_TIMEOUT_S)
    if code != 0:
        print(text[-4000:])
        return f"timeout {RUN_TIMEOUT_S} s" if code == TIMED_OUT else f"exit {code}"
    return {"path": "ours-lora", **host.steady_state(run / "metrics.jsonl")}


def peer(args: argparse.Namespace, data: Path, index: int | None = None) -> dict[str, Any] | str:
    return run_peer(args.out / numbered("peer-trl-lora", index), args.gpus, [
        "--lora", "--data", str(data), "--shape", SHAPE, "--max-length", str(args.budget),
        "--max-steps", str(args.steps)], RUN_TIMEOUT_S)


def derived(side: dict[str, Any], arch: dict, lengths: list[int], gpus: int, peak: float | None,
            adapters: int) -> dict[str, Any]:
    """A side's raw counts with its per-GPU throughput and MFU (4·N + 6·N_lora)."""
    return {**side, "gpu_count": gpus, "peak_flops": peak, "lora_params": adapters,
            **throughput_numbers(arch, lengths, side["real_tokens_per_s"], gpus, peak, adapters)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--docs", type=int, default=600)
    parser.add_argument("--budget", type=int, default=8192, help="packed tokens per micro-batch per GPU")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-multi-lora"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"runs a side, alternating from the peer (default {distribution.RUNS_PER_SIDE} with the "
                             "peer on GPUs, else 1; 1: the one-run-a-side file)")
    args = parser.parse_args()
    args.repeat = distribution.repeat_of(parser, args.repeat, not args.no_peer, host.CPU_SMOKE)
    arch = host.shape(SHAPE)
    max_doc = min(host.MAX_DOC_TOKENS, args.budget)
    lengths = sample_lengths(args.docs, seed=0, hi=max_doc)
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, lengths, arch["vocab_size"])
    adapters, peak = ModelShape.from_arch(arch).lora_params(LORA_R, list(LORA_TARGETS)), device_peak()[1]
    result: dict[str, Any] = {"gpu_count": args.gpus, "docs": args.docs, "max_doc_tokens": max_doc,
                              "budget": args.budget, "shape": "tiny" if host.CPU_SMOKE else SHAPE}
    if args.repeat > 1:
        compare(args, data, arch, lengths, result, lambda side: derived(side, arch, lengths, args.gpus, peak, adapters))
        return
    rows = []
    sides = [("8b_lora_peer", lambda: peer(args, data))] * (not args.no_peer) + [("8b_lora", lambda: ours(args, data, arch))]
    for key, run in sides:  # the file is rewritten after each side: a call cut short keeps the first
        side = run()
        if isinstance(side, dict):
            result[key] = derived(side, arch, lengths, args.gpus, peak, adapters)
            rows.append(result[key])
        else:
            result[f"{key}_error"] = side
        if "8b_lora" in result and "8b_lora_peer" in result:
            result["ratio_vs_peer"] = result["8b_lora"]["real_tokens_per_s"] / result["8b_lora_peer"]["real_tokens_per_s"]
        if args.results:
            write_result(args.results / f"multi-{args.gpus}gpu-8b-lora.json", result)
    print(f"\n| side ({args.gpus} GPUs) | real tokens/s | per GPU | MFU | peak GiB | steps timed |\n|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"| {r['path']} | {r['real_tokens_per_s']:,.0f} | {r['real_tokens_per_s'] / args.gpus:,.0f} | {mfu} | "
              f"{r['peak_mem_gib'] or 0:.1f} | {r['steps']} |")
    for key in ("8b_lora_error", "8b_lora_peer_error"):
        if key in result:
            print(f"| {key} | {result[key]} | | | | |")
    if "ratio_vs_peer" in result:
        print(f"ours / TRL+PEFT FSDP2: {result['ratio_vs_peer']:.2f}x")


def compare(args: argparse.Namespace, data: Path, arch: dict, lengths: list[int], result: dict[str, Any],
            measured: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """--repeat N runs a side alternating from the peer, every run recorded with ours' logged windows and the peer's
    step times (bench/report/distribution.py); the results file is rewritten after each run."""
    def written(fields: dict[str, Any]) -> None:
        if args.results:
            write_result(args.results / f"multi-{args.gpus}gpu-8b-lora.json", {**result, **fields})

    def run_ours(index: int) -> dict[str, Any]:
        side = ours(args, data, arch, index)
        if isinstance(side, str):
            return {"error": side}
        return {**measured(side), "windows": windows(args.out / numbered("ours-lora", index) / "metrics.jsonl")}

    def run_peer_side(index: int) -> dict[str, Any]:
        side = peer(args, data, index)
        return {"error": side} if isinstance(side, str) else measured(side)

    no_checkpointing = {"gradient_checkpointing": False}
    record = distribution.compare(args.repeat, run_peer_side, run_ours, {"path": "ours-lora", **no_checkpointing},
                                  {"path": "peer-trl-lora", **no_checkpointing}, written)
    print(f"\n| measurement ({args.gpus} GPUs) | value |\n|---|---|")
    for name, value in compare_rows(record, args.gpus, "8B LoRA", "TRL+PEFT FSDP2"):
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
