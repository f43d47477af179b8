"""The FP8 GEMMs of one decoder layer's q/k/v and gate/up linears: each linear on its own, as our float8
linears run them, against one linear per group (the group's weights stacked). What merging would gain,
measured before anything is built.

    python -m bench.kernels.gpu_fp8_gemms --shape llama3-8b --tokens 8192 [--json OUT.json]

Why: each of our float8 linears (train/kernels/fp8_linear.py) runs three GEMMs, the forward, the input
gradient and the weight gradient, and the input gradients of linears that share an input are then summed.
q, k and v share one input, gate and up another. Stacked, a group would run one GEMM of each kind, wider,
and no sum; k and v alone are narrow (1,024 columns at 8B). The tensorwise scales of a stacked weight
and of its stacked output gradient would then be one per group, not one per linear.

Times both ways with random float8 operands laid out as our linears hand them to torch._scaled_mm (e4m3
inputs and weights, e5m2 output gradients, one scale per tensor, fp32 accumulation), on one GPU; the
casts are not timed, as they move the same bytes either way. Prints one row per group.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

from bench.kernels.gpu_ceilings import median_ms
from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES
from contract.shape import ModelShape

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def groups(arch: dict) -> dict[str, list[int]]:
    """The output widths of the linears of each group that shares an input."""
    shape = ModelShape.from_arch(arch)
    return {name: [width for _, width in shape.linear_dims(linears)]
            for name, linears in (("q/k/v", ["q_proj", "k_proj", "v_proj"]), ("gate/up", ["gate_proj", "up_proj"]))}


def _fp8(shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(shape, device="cuda") * 0.5).to(dtype)


def linear_gemms(tokens: int, width: int, inner: int) -> Callable[[], torch.Tensor]:
    """The three GEMMs of one float8 linear [inner -> width] over `tokens`; returns its input gradient."""
    one = torch.ones((), device="cuda")
    x8, x8t = _fp8((tokens, inner), E4M3), _fp8((inner, tokens), E4M3)
    w8, w8t = _fp8((width, inner), E4M3), _fp8((inner, width), E4M3)
    dy8, dy8t = _fp8((tokens, width), E5M2), _fp8((width, tokens), E5M2)

    def run() -> torch.Tensor:
        torch._scaled_mm(x8, w8.t(), one, one, out_dtype=torch.bfloat16)
        torch._scaled_mm(dy8t, x8t.t(), one, one, out_dtype=torch.bfloat16)
        return torch._scaled_mm(dy8, w8t.t(), one, one, out_dtype=torch.bfloat16)

    return run


def measure(tokens: int, widths: list[int], inner: int) -> dict:
    """One group both ways: the linears one by one with their input gradients summed, and stacked."""
    separate = [linear_gemms(tokens, width, inner) for width in widths]
    stacked = linear_gemms(tokens, sum(widths), inner)

    def one_by_one() -> None:
        dx = separate[0]()
        for linear in separate[1:]:
            dx = dx + linear()

    flop = 6 * tokens * sum(widths) * inner
    separate_ms, stacked_ms = median_ms(one_by_one), median_ms(stacked)
    return {"widths": widths, "inner": inner, "separate_ms": separate_ms, "stacked_ms": stacked_ms,
            "separate_tflops": flop / separate_ms / 1e9, "stacked_tflops": flop / stacked_ms / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise SystemExit("gpu_fp8_gemms: needs a GPU with FP8 tensor cores (Ada, Hopper or newer)")
    arch = SHAPES[args.shape]
    rows = {name: measure(args.tokens, widths, arch["hidden_size"]) for name, widths in groups(arch).items()}
    print(f"\n{torch.cuda.get_device_name()}, {args.shape}, {args.tokens} tokens, the FP8 GEMMs of one layer's groups")
    print(f"{'group':8} {'widths':>20} {'separate ms':>11} {'stacked ms':>10} {'gain':>6} {'TFLOP/s sep':>11} "
          f"{'stacked':>8}")
    for name, row in rows.items():
        print(f"{name:8} {'+'.join(map(str, row['widths'])):>20} {row['separate_ms']:11.3f} {row['stacked_ms']:10.3f} "
              f"{row['separate_ms'] / row['stacked_ms']:5.2f}x {row['separate_tflops']:11.0f} "
              f"{row['stacked_tflops']:8.0f}")
    if args.json:
        write_result(args.json, {"device": torch.cuda.get_device_name(), "shape": args.shape, "tokens": args.tokens,
                                 "groups": rows})


if __name__ == "__main__":
    main()
