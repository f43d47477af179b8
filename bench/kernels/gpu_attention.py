"""Packed causal varlen attention, forward + backward, per kernel, on the benchmark's documents.

    python -m bench.kernels.gpu_attention --shape llama3.2-1b --tokens 32768 [--json OUT.json]

Packs the gpu_single documents (bench/common/synthetic.py lengths) best-fit into rows of `--tokens`, and
times one layer's attention (q [T, H, D], GQA k/v) through each kernel we can reach: FlashAttention-4
(train/kernels/fa4.py), torch's FA2 varlen kernel, and cuDNN's ragged attention (aten._cudnn_attention_forward,
GQA native, or with k/v repeated when cuDNN refuses GQA). Each repeat cycles through several packs,
as training does, so a kernel that rebuilds a plan per new pack shape pays for it here. TFLOP/s use
our MFU count (causal: 6·s per token per head-dim unit, fwd + bwd).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.kernels.gpu_ceilings import median_ms
from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES, sample_lengths
from train.dataset.packing import plan_micro_batches

PACKS = 4


def packs(tokens: int, docs: int) -> list[list[int]]:
    lengths = sample_lengths(docs)
    plan = plan_micro_batches(lengths, tokens, seed=0, epoch=0)
    full = sorted(plan, key=lambda bin_: -sum(lengths[i] for i in bin_))[:PACKS]
    return [[lengths[i] for i in bin_] for bin_ in full]


def make_inputs(doc_lengths: list[int], heads: int, kv_heads: int, head_dim: int) -> dict:
    total = sum(doc_lengths)
    cu = torch.tensor([0] + doc_lengths, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)

    def leaf(h):
        return torch.randn(total, h, head_dim, device="cuda", dtype=torch.bfloat16).requires_grad_()

    return {"q": leaf(heads), "k": leaf(kv_heads), "v": leaf(kv_heads), "cu": cu, "max": max(doc_lengths),
            "grad": torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16),
            "flop": 6 * heads * head_dim * sum(n * n for n in doc_lengths)}  # causal: 2·a·n² fwd, x3


def fa4(i):
    from train.kernels.fa4 import fa4_varlen_attention

    return fa4_varlen_attention(i["q"], i["k"], i["v"], i["cu"], i["cu"], i["max"], i["max"], None)


def torch_fa2(i):
    from train.kernels.attention import torch_varlen_kernel

    return torch_varlen_kernel(i["q"], i["k"], i["v"], i["cu"], i["cu"], i["max"], i["max"], None, 0.0)


def cudnn(i, expand: bool = False):
    k, v = i["k"], i["v"]
    if expand:
        repeat = i["q"].shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
    return torch.ops.aten._cudnn_attention_forward(
        i["q"], k, v, None, i["cu"], i["cu"], i["max"], i["max"], True, 0.0, True, False)[0]


def reference(i) -> torch.Tensor:
    outs = []
    bounds = i["cu"].tolist()
    repeat = i["q"].shape[1] // i["k"].shape[1]
    for start, end in zip(bounds[:-1], bounds[1:]):
        q, k, v = (t[start:end].detach().float().transpose(0, 1) for t in (i["q"], i["k"], i["v"]))
        k, v = k.repeat_interleave(repeat, 0), v.repeat_interleave(repeat, 0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


def fwd_bwd(kernel, i) -> None:
    out = kernel(i)
    torch.autograd.grad(out, (i["q"], i["k"], i["v"]), i["grad"])


def measure(name: str, kernel, inputs: list[dict]) -> dict:
    try:
        error = ((kernel(inputs[0]).float() - reference(inputs[0])).abs().max()).item()
        cycle = iter(range(10**9))
        ms = median_ms(lambda: fwd_bwd(kernel, inputs[next(cycle) % len(inputs)]))
    except Exception as failure:  # a kernel this torch/GPU cannot run: say why, keep the others
        return {"kernel": name, "error": f"{type(failure).__name__}: {str(failure).splitlines()[0][:160]}"}
    flop = sum(i["flop"] for i in inputs) / len(inputs)
    return {"kernel": name, "ms": ms, "tflops": flop / ms / 1e9, "max_abs_err": error}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--docs", type=int, default=1200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    arch = SHAPES[args.shape]
    heads, kv_heads = arch["num_attention_heads"], arch["num_key_value_heads"]
    head_dim = arch["hidden_size"] // heads
    inputs = [make_inputs(lengths, heads, kv_heads, head_dim) for lengths in packs(args.tokens, args.docs)]
    rows = [measure("FlashAttention-4 (train/kernels/fa4.py)", fa4, inputs),
            measure("torch varlen (FA2)", torch_fa2, inputs),
            measure("cuDNN ragged, GQA native", cudnn, inputs),
            measure("cuDNN ragged, k/v repeated", lambda i: cudnn(i, expand=True), inputs)]
    layers = arch["num_hidden_layers"]
    print(f"\n{torch.cuda.get_device_name()}, {args.shape}, packs of {[int(i['cu'][-1]) for i in inputs]} tokens, "
          f"head dim {head_dim}, {heads}/{kv_heads} heads; one layer fwd+bwd")
    print(f"{'kernel':34} {'ms':>7} {'x layers':>9} {'TFLOP/s':>8} {'max abs err':>12}")
    for row in rows:
        if "error" in row:
            print(f"{row['kernel']:34} failed: {row['error']}")
        else:
            print(f"{row['kernel']:34} {row['ms']:7.3f} {row['ms'] * layers:9.1f} {row['tflops']:8.0f} "
                  f"{row['max_abs_err']:12.2e}")
    if args.json:
        write_result(args.json, {"device": torch.cuda.get_device_name(), "shape": args.shape,
                                 "tokens": args.tokens, "docs": args.docs, "rows": rows})


if __name__ == "__main__":
    main()
