"""Phase `8b-fp8` of bench/multi/gpu_multi.py: 8B full fine-tuning on all GPUs of the host, --precision fp8
(torchao float8 linears, --fp8-recipe) against our bf16 path in the same call, same documents and settings;
the speed-up of real tokens/s.

    python -m bench.multi.gpu_multi --gpus 4 --only 8b-fp8 --steps8b 20 --tag fp8 --results DIR   # multi-4gpu-fp8.json

Both runs are rendered by `sft-launch` and started as a 2-node job (bench/multi/gpu_multi.py: 2 machines x G/2
processes), as phase 8b-peer (bench/multi/multi_full.py) runs ours: random weights drawn per shard, FSDP2,
compiled layers, no activation checkpointing unless --fp8-checkpointing, --tokens8b-fp8 tokens per GPU,
--steps8b steps, no save. --fp8-baseline takes the bf16 side from an earlier file of the same call
instead of a run of its own; --fp8-set overrides train.toml for the FP8 run alone. The record goes into
gpu_multi's results file (multi-<gpus>gpu-<tag>.json) under `fp8_8b`.
"""

from __future__ import annotations

import argparse
import json
import typing
from pathlib import Path

from bench.multi import host, multi_full
from contract.config import Fp8Recipe


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens8b-fp8", type=int, default=8192)
    parser.add_argument("--fp8-recipe", default="tensorwise", choices=typing.get_args(Fp8Recipe))
    parser.add_argument("--fp8-checkpointing", action="store_true", help="8b-fp8: activation checkpointing on")
    parser.add_argument("--fp8-timeout", type=float, default=None, help="8b-fp8: each run's wall-clock limit (s)")
    parser.add_argument("--fp8-baseline", type=Path, default=None, help="8b-fp8: the bf16 side from this "
                        "multi-<gpus>gpu-8b-full.json (phase 8b-peer) or multi-<gpus>gpu-<tag>.json (phase 8b-fp8), "
                        "earlier in the same call with the same settings, instead of a run of its own")
    parser.add_argument("--fp8-set", action="append", default=[], metavar="KEY=VALUE",
                        help="8b-fp8: a train.toml override for the FP8 run only, e.g. train.fp8_fast_accum=false")


def bf16_baseline(path: Path) -> dict | None:
    """Our bf16 run in an earlier file of the call: phase 8b-peer's ours, or phase 8b-fp8's bf16 side."""
    earlier = json.loads(path.read_text())
    return earlier.get("8b_full") or earlier.get("fp8_8b", {}).get("bf16")


def bench_8b_fp8(args: argparse.Namespace, data: Path, result: dict, rows: list) -> None:
    """8B full fine-tuning, our bf16 path and --precision fp8 (torchao float8 linears, --fp8-recipe) in the
    same call, otherwise identical and as phase 8b-peer runs ours: random weights drawn per shard (no
    checkpoint to write or read), FSDP2, compiled layers, no activation checkpointing unless
    --fp8-checkpointing, --tokens8b-fp8 tokens per GPU, --steps8b steps, no save (--fp8-baseline: the bf16
    side is phase 8b-peer's run of ours from this call, whose clock stops for its one save); each run under
    --fp8-timeout seconds, TORCH_LOGS=recompiles and its per-window timings kept (a stall is visible)."""
    runs = {}
    arch = host.shape("llama3-8b")
    if args.fp8_baseline:  # a bf16 run of ours earlier in the same call, with the same settings
        baseline = bf16_baseline(args.fp8_baseline)
        if baseline is None:
            rows.append(("8B bf16", f"no run of ours in {args.fp8_baseline}"))
            return
        runs["auto"] = {k: v for k, v in baseline.items() if k not in ("windows", "recompiles")}
    for precision, port in (("auto", 29630), ("fp8", 29631))[1 if args.fp8_baseline else 0:]:
        # a run directory per --tag: a second FP8 run in the first's directory appended its records to the
        # first's metrics.jsonl (a requeued job continues its file), and its results summed both runs
        run = args.out / f"run-8b-{precision}{host.tagged(args)}"
        host.render(run, "llama3-8b", data, args.gpus, [
            "--max_steps", str(args.steps8b), "--save_steps", "1000000",
            "--gradient_checkpointing", str(args.fp8_checkpointing).lower(),
            *host.random_weights(arch, sharded=True),
            "--precision", precision, "--fp8_recipe", args.fp8_recipe,
            "--set", f"data.tokens_per_micro_batch={args.tokens8b_fp8}",
            "--set", f"train.compile={str(not host.CPU_SMOKE).lower()}",
            *(word for item in (args.fp8_set if precision == "fp8" else []) for word in ("--set", item))])
        code, text = host.launch(run, args.gpus, port, args.fp8_timeout, {"TORCH_LOGS": "recompiles"})
        label = "8B bf16" if precision == "auto" else f"8B FP8 ({args.fp8_recipe})"
        stats = host.run_stats(run, code, text, rows, label, arch, args.gpus, args.lengths)
        if stats is None:
            result[f"fp8_8b_{precision}_error"] = f"exit {code}"
            return
        runs[precision] = dict(stats, tokens_per_micro_batch=args.tokens8b_fp8, gradient_checkpointing=args.fp8_checkpointing,
                               windows=multi_full.windows(run / "metrics.jsonl"), recompiles=multi_full.recompiles(text))
        rows.append((f"{label}: tokens/s/GPU, MFU vs bf16 peak, peak GiB",
                     f"{stats['real_tokens_per_s'] / args.gpus:,.0f}, {(stats['mfu'] or 0) * 100:.1f}%, "
                     f"{stats['peak_mem_gib']:.1f}"))
    result["fp8_8b"] = {"bf16": runs["auto"], "fp8": runs["fp8"], "recipe": args.fp8_recipe, "fp8_set": args.fp8_set,
                        "speedup": runs["fp8"]["real_tokens_per_s"] / runs["auto"]["real_tokens_per_s"]}
    rows.append(("8B FP8 / bf16 real tokens/s", f"{result['fp8_8b']['speedup']:.2f}x (target >= 1.25x)"))
