"""One Llama MLP, forward + backward, stock against SwiGLU fused into the GEMMs (train/kernels/swiglu.py).

    python -m bench.kernels.gpu_mlp --shape llama3.2-1b --tokens 32768 [--json OUT.json]

Both run as training runs them: fp32 master weights under bf16 autocast, inside torch.compile. The
fused MLP runs twice: with the GEMM configs pinned in train/assets/gemm_configs.json (what training
uses; `python -m bench.kernels.gpu_gemm_tune --write` measures them) and with quack's default configs.
Prints per-layer milliseconds (CUDA events, median after warm-up), the activation memory each keeps
for its backward, the first call's time (kernel JIT), and the largest error of each against an fp32
reference, relative to the reference's largest value.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from bench.kernels.gpu_ceilings import median_ms
from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES
from train.kernels import swiglu
from train.kernels.swiglu import swiglu_mlp, unavailable


def stock_mlp(x, gate, up, down):
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def make_inputs(d: int, ffn: int, tokens: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, d, device="cuda", generator=g).bfloat16().requires_grad_()
    weights = [(torch.randn(shape, device="cuda", generator=g) * shape[1] ** -0.5).requires_grad_()
               for shape in ((ffn, d), (ffn, d), (d, ffn))]
    dout = torch.randn(tokens, d, device="cuda", generator=g).bfloat16()
    return x, *weights, dout


def run(fn, x, gate, up, down, dout) -> list[torch.Tensor]:
    for tensor in (x, gate, up, down):
        tensor.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fn(x, gate, up, down)
    out.backward(dout)
    return [out, x.grad, gate.grad, up.grad, down.grad]


def reference(x, gate, up, down, dout) -> list[torch.Tensor]:
    leaves = [t.detach().double().requires_grad_() for t in (x, gate, up, down)]
    out = stock_mlp(*leaves)
    out.backward(dout.double())
    return [out] + [t.grad for t in leaves]


def saved_bytes(fn, inputs) -> int:
    """Bytes held between forward and backward (the activations kept for the backward)."""
    x, gate, up, down, _ = inputs
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fn(x, gate, up, down)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    del out
    return held


def measure(name: str, fn, inputs, ref) -> dict:
    started = time.perf_counter()
    results = run(fn, *inputs)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - started
    errors = [((r.double() - e).abs().max() / e.abs().max()).item() for r, e in zip(results, ref)]
    ms = median_ms(lambda: run(fn, *inputs))
    return {"path": name, "ms": ms, "first_call_s": first_s, "saved_gib": saved_bytes(fn, inputs) / 2**30,
            "max_rel_err": max(errors)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    reason = unavailable(torch.device("cuda"))
    if reason:
        raise SystemExit(f"gpu_mlp: {reason}")
    arch = SHAPES[args.shape]
    inputs = make_inputs(arch["hidden_size"], arch["intermediate_size"], args.tokens)
    ref = reference(*inputs)
    rows = [measure("stock (cuBLAS + compiled SwiGLU)", torch.compile(stock_mlp, dynamic=True), inputs, ref),
            measure("fused SwiGLU, pinned configs", torch.compile(swiglu_mlp, dynamic=True), inputs, ref)]
    swiglu.pinned_config.cache_clear()
    with mock.patch.object(swiglu, "_pinned_fields", dict):  # as if the file listed nothing
        rows.append(measure("fused SwiGLU, quack's default configs", torch.compile(swiglu_mlp, dynamic=True),
                            inputs, ref))
    swiglu.pinned_config.cache_clear()
    layers = arch["num_hidden_layers"]
    print(f"\n{torch.cuda.get_device_name()}, {args.shape}, {args.tokens} tokens, one MLP fwd+bwd")
    print(f"{'path':36} {'ms':>7} {'x layers':>9} {'saved GiB':>10} {'first s':>8} {'max rel err':>12}")
    for row in rows:
        print(f"{row['path']:36} {row['ms']:7.3f} {row['ms'] * layers:9.1f} {row['saved_gib']:10.2f} "
              f"{row['first_call_s']:8.1f} {row['max_rel_err']:12.2e}")
    if args.json:
        write_result(args.json, {"device": torch.cuda.get_device_name(), "shape": args.shape,
                                 "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
