"""The GPU's two ceilings and every matmul of one training step, each timed alone.

    python -m bench.kernels.gpu_ceilings --shape llama3.2-1b --tokens 32768 [--json OUT.json]

Prints: device-to-device copy bandwidth (bytes read + written per second), a large square bf16
matmul's TFLOP/s, and for the model shape each linear layer's three matmuls (forward X·Wᵀ, input
gradient dY·W, weight gradient dYᵀ·X) and the lm_head's fused-loss chunks, at `--tokens` packed
tokens. Their sum is the step's matmul floor on this GPU with cuBLAS, to hold against the profile's
measured matmul time (train.profile_steps): what is left beyond it is not in the matmuls.
Timing: CUDA events, median of repeats after warm-up, random (not zero) inputs.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from unittest import mock

import torch

from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES

REPEATS = 20


def median_ms(fn, repeats: int = REPEATS) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    src = torch.randn(512 * 2**20, device="cuda")  # 2 GiB fp32
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6


def matmul_ms(m: int, n: int, k: int, accumulate: bool = False) -> float:
    """[m, k] @ [k, n] in bf16; with `accumulate`, added into an existing [m, n] output (addmm)."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    if accumulate:
        c = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        return median_ms(lambda: c.addmm_(a, b))
    return median_ms(lambda: torch.mm(a, b))


def linear_shapes(arch: dict) -> list[tuple[str, int, int, int]]:
    """(name, in_features, out_features, count per layer) of a Llama decoder layer."""
    d, ffn = arch["hidden_size"], arch["intermediate_size"]
    kv = arch["num_key_value_heads"] * d // arch["num_attention_heads"]
    return [("q_proj, o_proj", d, d, 2), ("k_proj, v_proj", d, kv, 2), ("gate_proj, up_proj", d, ffn, 2),
            ("down_proj", ffn, d, 1)]


def step_matmuls(arch: dict, tokens: int, loss_chunk: int) -> list[dict]:
    rows = []
    for name, fan_in, fan_out, count in linear_shapes(arch):
        times = [matmul_ms(tokens, fan_out, fan_in), matmul_ms(tokens, fan_in, fan_out),
                 matmul_ms(fan_out, fan_in, tokens)]
        rows.append({"what": f"{name} (x{count * arch['num_hidden_layers']})", "fwd_ms": times[0],
                     "dgrad_ms": times[1], "wgrad_ms": times[2], "count": count * arch["num_hidden_layers"],
                     "flop": 3 * 2 * tokens * fan_in * fan_out})
    d, vocab = arch["hidden_size"], arch["vocab_size"]
    chunks = -(-tokens // loss_chunk)
    times = [matmul_ms(loss_chunk, vocab, d), matmul_ms(loss_chunk, d, vocab),
             matmul_ms(vocab, d, loss_chunk, accumulate=True)]
    rows.append({"what": f"lm_head, {chunks} chunks of {loss_chunk} tokens", "fwd_ms": chunks * times[0],
                 "dgrad_ms": chunks * times[1], "wgrad_ms": chunks * times[2], "count": 1,
                 "flop": 3 * 2 * tokens * d * vocab})
    return rows


def loss_ms(arch: dict, tokens: int) -> dict[str, float]:
    """Forward + backward of the fused lm_head + cross-entropy per backend (train/kernels/loss.py), bf16; our
    fused loss once with the softmax/gradient pass it picks here and once with the compiled pass."""
    from train.kernels import loss

    d, vocab = arch["hidden_size"], arch["vocab_size"]
    hidden = torch.randn(1, tokens, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(vocab, d, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (1, tokens), device="cuda")
    picked = loss.logit_grad_pass(hidden.device)
    cases = {f"fused ({picked} pass)": ("fused", picked), "fused (compiled pass)": ("fused", "compiled"),
             "liger": ("liger", picked)}
    times = {}
    for name, (backend, ce_pass) in cases.items():
        def run() -> None:
            loss.linear_cross_entropy_sum(hidden, weight, labels, backend=backend).backward()
        try:
            with mock.patch.object(loss, "logit_grad_pass", lambda device, chosen=ce_pass: chosen):
                times[name] = median_ms(run, repeats=10)
        except RuntimeError as err:  # liger not installed
            print(f"loss backend {backend}: {err}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--loss-only", action="store_true", help="only the loss backends' forward + backward")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench.kernels.gpu_ceilings measures a CUDA GPU's ceilings; no CUDA device here (skipped)")
    arch = SHAPES[args.shape]
    if args.loss_only:
        losses = loss_ms(arch, args.tokens)
        print(f"\n{torch.cuda.get_device_name()}, lm_head + cross-entropy at {args.tokens} tokens, fwd + bwd: "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in losses.items()))
        if args.json:
            write_result(args.json, {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "tokens": args.tokens,
                                     "loss_fwd_bwd_ms": losses})
        return
    bandwidth = copy_bandwidth_gbs()
    square = 2 * 8192**3 / matmul_ms(8192, 8192, 8192) / 1e9
    table = []
    for chunk in (1024, 4096):  # Liger's chunk at 32k tokens and a 4x larger one
        rows = step_matmuls(arch, args.tokens, chunk)
        table.append({"loss_chunk": chunk, "rows": rows})
    losses = loss_ms(arch, args.tokens)
    result = {"gpu": torch.cuda.get_device_name(), "copy_gbs": bandwidth, "square_bf16_tflops": square,
              "shape": args.shape, "tokens": args.tokens, "steps": table, "loss_fwd_bwd_ms": losses}
    if args.json:
        write_result(args.json, result)
    print(f"\n{result['gpu']}: copy {bandwidth:,.0f} GB/s (read + write), bf16 8192^3 matmul {square:.0f} TFLOP/s")
    print("lm_head + cross-entropy, forward + backward: " + ", ".join(f"{k} {v:.1f} ms" for k, v in losses.items()))
    for entry in table:
        total_ms = sum((r["fwd_ms"] + r["dgrad_ms"] + r["wgrad_ms"]) * r["count"] for r in entry["rows"])
        flop = sum(r["flop"] * r["count"] for r in entry["rows"])
        print(f"\nmatmuls of one step at {args.tokens} tokens (loss chunk {entry['loss_chunk']}): "
              f"{total_ms:.1f} ms = {flop / total_ms / 1e9:.0f} TFLOP/s")
        print("| matmul | fwd ms | dgrad ms | wgrad ms | TFLOP/s |\n|---|---|---|---|---|")
        for r in entry["rows"]:
            ms = r["fwd_ms"] + r["dgrad_ms"] + r["wgrad_ms"]
            print(f"| {r['what']} | {r['fwd_ms']:.3f} | {r['dgrad_ms']:.3f} | {r['wgrad_ms']:.3f} | "
                  f"{r['flop'] / ms / 1e9:.0f} |")


if __name__ == "__main__":
    main()
