"""One Llama decoder layer, forward + backward, our bf16 path against FP8 variants: where FP8's time goes.

    python -m bench.kernels.gpu_fp8_layer --shape llama3-8b --tokens 8192 [--variants bf16-fused,fp8] [--json OUT.json]

Why: at 8B on 4 GPUs FP8's GEMMs ran 1.85x faster than bf16's, but the step gained only 1.13x; the
profile put the difference in compiled elementwise kernels (torchao's tensorwise amax and casts, and the
SwiGLU passes the fused MLP otherwise removes). A whole 8B run costs minutes of several GPUs; one
layer on one GPU shows the same kernels in seconds, so each way of running FP8 can be tried here first.

Each variant is a fresh transformers LlamaDecoderLayer (sdpa attention over one causal sequence of
--tokens, the same for every variant) with bf16 weights, as FSDP2's all-gather hands them to the
layer, under bf16 autocast, converted the way train/engine/model.py converts a model
(train/kernels/float8.py, train/kernels/swiglu.py) and compiled as train/kernels/perf.py compiles
it (dynamic shapes). Some variants change inductor settings for their compile only. Prints per variant
the median layer time (CUDA events after warm-up), that time x the shape's layer count, the
first call (compile), and the kernel time by kind over one profiled call with its largest compiled
kernels, which names the pass to remove next.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import torch

from bench.kernels.gpu_ceilings import median_ms
from bench.report.results_io import write_result
from bench.common.synthetic import SHAPES

# name -> (what the linears run in, which linears FP8 converts, inductor settings for its compile)
VARIANTS: dict[str, tuple[str, str, dict]] = {
    "bf16": ("stock", "", {}),
    "bf16-fused": ("fused", "", {}),  # our bf16 default: SwiGLU inside quack's GEMMs
    "fp8": ("tensorwise", "all", {}),  # torchao's tensorwise recipe
    "fp8-own": ("own", "all", {}),  # the same recipe, our casts (train/kernels/fp8_linear.py)
    "fp8-cdt": ("tensorwise", "all", {"coordinate_descent_tuning": True}),
    "fp8-mlp": ("tensorwise", "mlp", {}),  # attention projections stay bf16
    "fp8-attn+fused": ("tensorwise", "attn", {}),  # FP8 attention projections, the fused bf16 MLP
    "fp8-rowwise": ("rowwise", "all", {}),
    # the transposed float8 copies the weight-gradient GEMMs read are pointwise kernels with a transpose
    "fp8-nd": ("tensorwise", "all", {"triton.prefer_nd_tiling": True}),
    "fp8-nd-tr": ("tensorwise", "all", {"triton.prefer_nd_tiling": True, "triton.tile_reductions": True}),
}
MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")
COMPILED = "compiled elementwise"  # train/observe/profiling.py's kind of the triton kernels torch.compile writes
LARGEST = (COMPILED, "other")  # the kinds whose largest kernels a row names


def build_layer(arch: dict, variant: str) -> torch.nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from train.kernels import float8, swiglu

    config = LlamaConfig(**arch, attn_implementation="sdpa")
    layer = LlamaDecoderLayer(config, layer_idx=0).to("cuda", torch.bfloat16)
    recipe, which, _ = VARIANTS[variant]
    if recipe == "own":  # as training converts it: train.fp8_recipe = "tensorwise"
        float8.convert_decoder_linears([layer], "tensorwise", fast_accum=False)
    elif which:
        from torchao.float8 import convert_to_float8_training

        fp8_config = float8.float8_config(recipe, fast_accum=False)  # train.fp8_fast_accum's default
        keep = {"mlp": lambda fqn: fqn.split(".")[-1] in MLP_LINEARS,
                "attn": lambda fqn: fqn.split(".")[-1] not in MLP_LINEARS}.get(which, lambda fqn: True)
        convert_to_float8_training(layer, config=fp8_config,
                                   module_filter_fn=lambda m, fqn: float8.convertible(m, fqn) and keep(fqn))
    if recipe == "fused" or which == "attn":
        assert swiglu.use_fused_swiglu([layer.mlp]) == 1
    return layer


def make_inputs(arch: dict, tokens: int) -> tuple:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(1, tokens, arch["hidden_size"], device="cuda", generator=g, dtype=torch.bfloat16)
    positions = torch.arange(tokens, device="cuda")[None]
    rope = LlamaRotaryEmbedding(LlamaConfig(**arch)).to("cuda")
    cos_sin = rope(hidden, positions)
    dout = torch.randn_like(hidden)
    return hidden.requires_grad_(), positions, cos_sin, dout


def step(forward, hidden, positions, cos_sin, dout) -> None:
    hidden.grad = None
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = forward(hidden, position_ids=positions, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(dout)


def kernel_kinds(run, top: int = 5) -> tuple[dict[str, float], dict[str, list[tuple[str, float]]]]:
    """Kernel milliseconds of one call by kind (the kinds of training's profile, train/observe/profiling.py),
    and by kind (compiled triton kernels, and the uncompiled ones of kind "other": copies, casts), its `top`
    largest kernels."""
    from torch.profiler import ProfilerActivity, profile

    from train.observe.profiling import kernel_kind

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kinds: dict[str, float] = collections.Counter()
    named: dict[str, dict[str, float]] = {kind: collections.Counter() for kind in LARGEST}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        ms = event.device_time / 1e3
        kind = kernel_kind(event.name)
        kinds[kind] += ms
        if kind in named:
            named[kind][event.name[:60]] += ms
    return dict(kinds), {kind: sorted(ms.items(), key=lambda kv: -kv[1])[:top] for kind, ms in named.items()}


def measure(arch: dict, variant: str, inputs: tuple, top: int = 5) -> dict:
    torch._dynamo.reset()  # each variant compiles afresh (the layers share one forward's code)
    layer = build_layer(arch, variant)
    inductor = VARIANTS[variant][2]
    forward = torch.compile(layer.forward, dynamic=True)
    started = time.perf_counter()
    with torch._inductor.config.patch(inductor):
        step(forward, *inputs)
        torch.cuda.synchronize()
    first_s = time.perf_counter() - started
    ms = median_ms(lambda: step(forward, *inputs))
    kinds, largest = kernel_kinds(lambda: step(forward, *inputs), top)
    torch.cuda.reset_peak_memory_stats()
    step(forward, *inputs)
    return {"variant": variant, "ms": ms, "first_call_s": first_s, "kernel_ms": kinds,
            "largest_compiled": largest[COMPILED], "largest_other": largest["other"],
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "inductor": inductor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--top", type=int, default=5, help="how many of the largest kernels of each kind a row names")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        raise SystemExit("gpu_fp8_layer: needs a GPU with FP8 tensor cores (Ada, Hopper or newer)")
    arch = SHAPES[args.shape]
    inputs = make_inputs(arch, args.tokens)
    rows = []
    for variant in args.variants.split(","):
        try:
            rows.append(measure(arch, variant, inputs, args.top))
        except Exception as error:  # one variant's failure (a kernel missing here) must not lose the others
            rows.append({"variant": variant, "error": f"{type(error).__name__}: {error}"[:300]})
        print(rows[-1], flush=True)
    report(args, arch, rows)


def report(args: argparse.Namespace, arch: dict, rows: list[dict]) -> None:
    layers = arch["num_hidden_layers"]
    base = next((r["ms"] for r in rows if r["variant"] == "bf16-fused" and "ms" in r), None)
    print(f"\n{torch.cuda.get_device_name()}, {args.shape}, {args.tokens} tokens, one decoder layer fwd+bwd")
    print(f"{'variant':16} {'ms':>7} {'x layers':>9} {'vs bf16-fused':>13} {'matmul':>7} {'compiled':>9} "
          f"{'attn':>6} {'other':>6} {'peak GiB':>8} {'first s':>7}")
    for row in rows:
        if "error" in row:
            print(f"{row['variant']:16} {row['error']}")
            continue
        k = row["kernel_ms"]
        ratio = f"{base / row['ms']:.2f}x" if base else "-"
        print(f"{row['variant']:16} {row['ms']:7.3f} {row['ms'] * layers:9.1f} {ratio:>13} {k.get('matmul', 0):7.2f} "
              f"{k.get(COMPILED, 0):9.2f} {k.get('attention', 0):6.2f} {k.get('other', 0):6.2f} "
              f"{row['peak_gib']:8.2f} {row['first_call_s']:7.1f}")
    if args.json:
        write_result(args.json, {"device": torch.cuda.get_device_name(), "shape": args.shape,
                                 "tokens": args.tokens, "rows": rows})


if __name__ == "__main__":
    main()
