"""Pick the configs of the fused MLP's two quack GEMMs (train/kernels/swiglu.py) once per GPU and shape.

    python -m bench.kernels.gpu_gemm_tune --shapes 1b,8b --tokens 32768 [--write] [--json bench/results/GPU/gemm-tune.json]

For each Llama MLP shape, times the gate/up GEMM with the SwiGLU epilogue ("gated") and the
dout @ W_down GEMM with the SwiGLU-gradient epilogue ("dgated") under every config quack offers
for this GPU generation, checks each against quack's default config's output, and prints the
best next to quack's default config (timed in the same loop) and to cuBLAS running the same matmul
without the epilogue. `--write` merges into train/assets/gemm_configs.json, which training reads,
the winners that beat quack's default by at least PIN_MIN_GAIN (and removes the others' entries).

Why pin at all: quack's own autotuner keys on the exact token count, and packed rows change it
nearly every step (BENCHMARKS.md #13: minutes of tuning per new count). The best tile for a
32k-token GEMM is the best for any count near it, so one measurement per shape serves every step.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import time
from pathlib import Path

import torch

from bench.kernels.gpu_ceilings import median_ms
from bench.report.results_io import write_result
from train.kernels import swiglu

# A pin must beat quack's default by this much: one config timed twice differed by up to 2.6% (H100).
PIN_MIN_GAIN = 0.05
# Llama-3 family MLPs: name -> (hidden_size, intermediate_size).
MLP_SHAPES = {"1b": (2048, 8192), "3b": (3072, 8192), "8b": (4096, 14336), "70b": (8192, 28672)}


def candidates(capability: tuple[int, int]) -> list:
    """quack's gated-epilogue config space for this GPU generation (its autotuner's list)."""
    configs = importlib.import_module("quack.gemm_config").get_all_configs("gated")
    return [c for c in configs if c.device_capacity == capability[0]]


def gemm_calls(d: int, ffn: int, tokens: int) -> dict[str, tuple]:
    """gemm name -> (run(config), the equivalent plain matmul, N, K) on random bf16 operands."""
    gemm = swiglu._gemm()
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, device="cuda", generator=g) * scale).bfloat16()

    x, dout = randn(tokens, d), randn(tokens, d)
    w_gate_up, w_down = randn(2 * ffn, d, scale=d ** -0.5), randn(d, ffn, scale=ffn ** -0.5)
    preact = x @ w_gate_up.T
    return {
        "gated": (lambda c: gemm.gemm_gated(x, w_gate_up.T, activation="swiglu", tuned=False, config=c),
                  lambda: x @ w_gate_up.T, 2 * ffn, d),
        "dgated": (lambda c: gemm.gemm_dgated(dout, w_down, preact, activation="swiglu", dynamic_scheduler=True,
                                              tuned=False, config=c),
                   lambda: dout @ w_down, ffn, d),
    }


def tune_one(run, plain, candidate_configs) -> dict:
    """Time quack's default config (None) and every candidate; the errors are against the default's output."""
    reference = [t.float() for t in run(None)]
    cublas_ms, timings, started = median_ms(plain), [], time.perf_counter()
    for config in [None, *candidate_configs]:
        try:
            outputs = run(config)
            torch.cuda.synchronize()
        except Exception as error:  # a config this shape or quack version cannot run
            print(f"    skip {config}: {type(error).__name__}: {str(error)[:120]}")
            continue
        error = max(((o.float() - r).abs().max() / r.abs().max()).item() for o, r in zip(outputs, reference))
        if error > 1e-2:
            print(f"    skip {config}: differs from the default config's output by {error:.1e}")
            continue
        timings.append((median_ms(lambda: run(config)), config))
    default_ms = timings[0][0]
    best_ms, best = min(timings[1:], key=lambda t: t[0])
    return {"config": dataclasses.asdict(best), "ms": best_ms, "quack_default_ms": default_ms,
            "cublas_plain_ms": cublas_ms, "candidates": len(timings) - 1, "tuning_s": time.perf_counter() - started,
            "pinned": best_ms <= (1 - PIN_MIN_GAIN) * default_ms}


def write_pins(results: dict) -> None:
    data = json.loads(swiglu.GEMM_CONFIGS.read_text())
    for key, entry in results.items():
        data["configs"].pop(key, None)
        if entry.pop("pinned"):
            data["configs"][key] = entry
    swiglu.GEMM_CONFIGS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="1b", help=f"comma-separated, of {sorted(MLP_SHAPES)}")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--write", action="store_true", help=f"merge the pins into {swiglu.GEMM_CONFIGS}")
    parser.add_argument("--json", type=Path, help="write every tuned GEMM (pinned or not) as a bench/results file")
    args = parser.parse_args()
    reason = swiglu.unavailable(torch.device("cuda"))
    if reason:
        raise SystemExit(f"gpu_gemm_tune: {reason}")
    capability = torch.cuda.get_device_capability()
    configs, gpu = candidates(capability), torch.cuda.get_device_name()
    results = {}
    for name in args.shapes.split(","):
        d, ffn = MLP_SHAPES[name]
        for gemm, (run, plain, n, k) in gemm_calls(d, ffn, args.tokens).items():
            print(f"{name} {gemm}: {len(configs)} candidate configs", flush=True)
            entry = tune_one(run, plain, configs)
            results[swiglu.config_key(capability, gemm, n, k)] = {**entry, "gpu": gpu, "tokens": args.tokens}
    print(f"\n{gpu}, {args.tokens} tokens; ms per GEMM")
    print(f"{'GEMM':28} {'best':>7} {'quack default':>14} {'cuBLAS, no epilogue':>20} {'tuning s':>9} {'pin':>4}  best")
    for key, e in results.items():
        c = e["config"]
        print(f"{key:28} {e['ms']:7.3f} {e['quack_default_ms']:14.3f} {e['cublas_plain_ms']:20.3f} {e['tuning_s']:9.0f}"
              f" {'yes' if e['pinned'] else 'no':>4}  {c['tile_m']}x{c['tile_n']} cluster {c['cluster_m']}x{c['cluster_n']}"
              f" pingpong={c['pingpong']}")
    if args.json:
        write_result(args.json, {"gpu": gpu, "tokens": args.tokens, "shapes": args.shapes, "gemms": results})
    if args.write:
        write_pins(results)


if __name__ == "__main__":
    main()
