"""Long context on one GPU (issue #54): 8B LoRA trained on whole 256k-token documents, which fit only with
the activation offload and the chunked MLP (train/kernels/long_context.py); 128k without them was the
ceiling (37.3-39.9% MFU at 32k-128k, 87 GiB at 128k).

    python -m bench.suites.gpu_long_context                 # one H200: 8B LoRA, 256k tokens a sequence (< 8 min)
    python -m bench.suites.gpu_long_context --cpu-smoke     # tiny shape on CPU: proves the script runs
    python -m bench.suites.gpu_long_context --tokens 131072 --steps 4 --variants resident,resident-keep-attention
                                                            # 128k: attention's forward recomputed or kept

Each variant trains `--steps` optimizer steps on documents of exactly `--tokens` tokens (one document a
micro-batch, FA4 varlen attention, per-layer checkpointing, eager layers: at 256k attention is ~85% of the
FLOPs, and compiling would add minutes). The steps after the first (CUDA/FA4 warm-up) are timed together
(`timed_steps`, `real_tokens`, `seconds`; files before 2026-12-06 give the last step's rate alone): tokens/s, MFU (contract.shape's FLOPs, LoRA counted as 4N + 6N_lora), the allocator's
peak and what the planner predicted for the same settings. Prints a table and, with --results, one
`longctx-<shape>-lora-<tokens>.json` per variant through bench/report/results_io (fields `seq_len`,
`context_parallel`; tests/bench/test_results.py re-derives its FLOPs and MFU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.suites.gpu_single import TINY, device_peak, write_train_toml
from bench.common.processes import TIMED_OUT, run_logged
from bench.common.synthetic import SHAPES, write_token_jsonl
from bench.report.results_io import throughput_numbers, write_result
from contract.config import LoraSection
from contract.shape import ModelShape
from launcher.plan.memory import GIB
from launcher.plan.planner import PlanInput, make_plan

RUN_TIMEOUT_S = int(os.environ.get("BENCH_RUN_TIMEOUT_S", "450"))
# name -> train.toml overrides on top of: LoRA r16, checkpointing, eager layers, fused loss
VARIANTS: dict[str, dict[str, Any]] = {
    "offload-mlp-chunks": {"activation_offload": True, "mlp_chunk_tokens": 16384},
    "resident": {},  # no offload, no MLP chunks: 128k fits one H200 so (87 GiB), the fastest setting there
    # "resident" whose checkpoints keep attention's outputs: its forward runs once, not twice (+32.5 GiB at 128k)
    "resident-keep-attention": {"recompute_attention": False},
    # the layers' checkpointed inputs in host memory, attention's outputs kept on the GPU: the keep-attention speed
    # where "resident-keep-attention" would not fit (its inputs are 32 GiB at 128k, the kept outputs 32.5)
    "offload-keep-attention": {"activation_offload": True, "recompute_attention": False},
    # the same without LoRA dropout: PEFT's per-adapter dropout copies and masks (~14 GiB at 128k on this shape,
    # launcher/plan/activations.py lora_path_bytes_per_token) are what keeps it off one H100's 80 GB
    "offload-keep-attention-nodrop": {"activation_offload": True, "recompute_attention": False, "lora_dropout": 0.0},
    # and the MLP in 16k-token chunks (its 128k intermediates are ~3.5 GiB each): the margin that variant lacks on an H100
    "offload-chunks-keep-attention-nodrop": {"activation_offload": True, "mlp_chunk_tokens": 16384,
                                             "recompute_attention": False, "lora_dropout": 0.0},
}
LORA_KEYS = {"lora_dropout": "dropout"}  # variant keys that go to [lora], not [train]
WARMUP_STEPS = 1  # the first step includes CUDA/FA4 warm-up and the allocator's growth: not timed


def settings(name: str, tokens: int, steps: int, cpu: bool) -> dict[str, dict[str, Any]]:
    variant = VARIANTS[name]
    train = {"compile": False, "gradient_checkpointing": True, "max_steps": steps, "logging_steps": 1,
             "warmup_ratio": 0.0, **{key: value for key, value in variant.items() if key not in LORA_KEYS}}
    if cpu:
        train["mlp_chunk_tokens"] = min(train.get("mlp_chunk_tokens", 0), 64)
    lora = {"enabled": True, **{LORA_KEYS[key]: value for key, value in variant.items() if key in LORA_KEYS}}
    return {"train": train, "lora": lora,
            "model": {"attn_implementation": "sdpa" if cpu else "fa4"}}


def planned_gib(arch: dict[str, Any], tokens: int, overrides: dict[str, Any]) -> float:
    train = overrides["train"]
    plan = make_plan(PlanInput(arch=arch, gpus_per_node=1, gpu_type="h200", lora=True, micro_batch_tokens=tokens,
                               lora_dropout=overrides["lora"].get("dropout", LoraSection().dropout),
                               loss_chunk_tokens=4096, activation_offload=train.get("activation_offload", False),
                               mlp_chunk_tokens=train.get("mlp_chunk_tokens", 0),
                               recompute_attention=train.get("recompute_attention", True)))
    return plan.gpu.total / GIB


def run(name: str, out: Path, data: Path, arch: dict[str, Any], tokens: int, steps: int, cpu: bool) -> dict[str, Any]:
    run_dir = out / name
    overrides = settings(name, tokens, steps, cpu)
    toml = write_train_toml(run_dir, data, arch, tokens, overrides)
    log = run_dir / "train.log"
    code = run_logged([sys.executable, "-m", "train", "--config", str(toml)], log, RUN_TIMEOUT_S, dict(os.environ))
    row: dict[str, Any] = {"variant": name, "tokens": tokens, "planned_gib": planned_gib(arch, tokens, overrides),
                           "settings": overrides}
    if code != 0:
        print(log.read_text()[-3000:])
        return row | {"error": f"timeout {RUN_TIMEOUT_S} s" if code == TIMED_OUT else f"exit {code}"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tokens_per_s" in r]
    return row | timed(steps, tokens, arch) | {"step_records": steps}


def timed(steps: list[dict[str, Any]], tokens: int, arch: dict[str, Any]) -> dict[str, Any]:
    """The rate over every step after the warm-up (one document of `tokens` tokens a step, every token real):
    `real_tokens` / `seconds`, the seconds from the warm-up step's end to the last step's (metrics' elapsed_s, which
    counts training time only), and its MFU; the peak memory of the whole run."""
    first, last = steps[WARMUP_STEPS - 1], steps[-1]
    timed_steps = last["step"] - first["step"]
    real_tokens, seconds = timed_steps * tokens, last["elapsed_s"] - first["elapsed_s"]
    lora = LoraSection()
    adapters = ModelShape.from_arch(arch).lora_params(lora.r, lora.target_modules)
    _, peak = device_peak()
    rate = real_tokens / seconds
    return {"step": last["step"], "warmup_steps": WARMUP_STEPS, "timed_steps": timed_steps, "real_tokens": real_tokens,
            "seconds": seconds, "tokens_per_s": rate,
            **{key: value for key, value in throughput_numbers(arch, [tokens], rate, 1, peak, adapters).items()
               if key in ("tflops_per_gpu", "mfu")},
            "peak_mem_gib": max(r.get("peak_mem_gib") or 0 for r in steps),
            "peak_reserved_gib": max(r.get("peak_reserved_gib") or 0 for r in steps)}


def record(row: dict[str, Any], arch: dict[str, Any], shape: str) -> dict[str, Any]:
    """The results file of one variant: the rate of its timed steps (`timed`), its
    FLOPs by contract.shape (one document of seq_len tokens: s̄ = seq_len; LoRA r16 on the default targets)."""
    lora = LoraSection()
    gpu, peak = device_peak()
    return {"shape": shape, "arch": arch, "seq_len": row["tokens"], "context_parallel": 1, "gpu_count": 1, "gpu": gpu,
            "peak_flops": peak, "lora_r": lora.r, "lora_targets": lora.target_modules,
            "lora_params": ModelShape.from_arch(arch).lora_params(lora.r, lora.target_modules), **row}


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = ["| variant | tokens/seq | step | tok/s | MFU | peak alloc GiB | peak reserved GiB | planned GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['tokens']} | {r['error']} | | | | | {r['planned_gib']:.1f} |")
            continue
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(f"| {r['variant']} | {r['tokens']} | {r['step']} | {cell(r['tokens_per_s'], ',.0f')} | "
                     f"{mfu} | {cell(r['peak_mem_gib'], '.1f')} | {cell(r['peak_reserved_gib'], '.1f')} | "
                     f"{r['planned_gib']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=262144, help="tokens per document (= per micro-batch)")
    parser.add_argument("--steps", type=int, default=4,
                        help="optimizer steps per variant: the first is warm-up, the rest are timed")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-long-context"))
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--results", type=Path, help="write longctx-*.json results files into this folder")
    args = parser.parse_args()
    arch, tokens = (TINY, 512) if args.cpu_smoke else (SHAPES["llama3-8b"], args.tokens)
    if args.cpu_smoke:
        os.environ["BENCH_CPU"] = "1"  # fp32 (bench/gpu_single.py)
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, [tokens] * args.steps, arch["vocab_size"])
    rows = [run(name, args.out, data, arch, tokens, args.steps, args.cpu_smoke) for name in args.variants.split(",")]
    shape = "tiny" if args.cpu_smoke else "llama3-8b"
    for row in rows:
        if args.results and "error" not in row:
            write_result(args.results / f"longctx-{shape}-lora-{row['tokens']}-{row['variant']}.json",
                         record(row, arch, shape))
    print(table(rows))


if __name__ == "__main__":
    main()
