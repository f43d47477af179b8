"""Bytes autograd saves per token for one Llama decoder layer, eager and torch.compile'd (CPU, no GPU).

    python -m bench.kernels.saved_activations            # table: measured vs launcher/plan/activations.py, per variant
    python -m bench.kernels.saved_activations --out x.json

Why: the planner's no-checkpointing activation count (launcher/plan/activations.py,
`layer_activation_bytes_per_token`) was the eager layer's saved set; with compiled layers the AOT
partitioner recomputes the norms' fp32 copies and the SwiGLU product, and with float8 linears the
matmul inputs as well, so the 8B runs on 4 H100s peaked ~16 GiB below the eager count. This runs one
bf16 LlamaDecoderLayer (sdpa attention, GQA) forward under `torch.autograd.graph.saved_tensors_hooks`
and sums the distinct storages saved (parameters and RoPE's cos/sin, shared by all layers, left out;
tensor subclasses such as torchao's float8 tensors counted by their inner tensors), at two token counts:
the slope is the per-token cost, the intercept the per-layer one (the fused MLP's weight copy).

Variants: eager, compiled, compiled + fused SwiGLU MLP (train/kernels/swiglu.py's custom ops, given CPU
kernels here: the partitioner only sees the ops' signatures), compiled + float8 linears, tensorwise (ours,
train/kernels/fp8_linear.py, and torchao's). The planner counts K and V at the query width for compiled
layers (torch <= 2.11's varlen_attn expands them); CPU sdpa takes GQA natively, so its column "planner (kv width)" is compared.
LoRA is left out: on CPU PEFT's adapters stay fp32 and cast their inputs up, which FSDP2's bf16
compute does not. No results file by default: the numbers are CPU partitioner decisions, not a GPU
peak (those are the calibration points in tests/launcher/test_planner_calibration.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPE = {"hidden_size": 256, "intermediate_size": 896, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 1, "vocab_size": 128}
TOKENS = (256, 512)
VARIANTS = ("eager", "compiled", "compiled+fused_mlp", "compiled+fp8", "compiled+fp8-torchao")
FP8_RECIPES = {"fp8": "tensorwise", "fp8-torchao": "torchao-tensorwise"}  # variant suffix -> train.fp8_recipe


def _register_cpu_swiglu() -> None:
    """CPU kernels for sft::swiglu_mlp_fwd/bwd (CUDA-only in train/kernels/swiglu.py), same outputs."""
    import torch
    import torch.nn.functional as F

    from train.kernels import swiglu

    def forward(x, w_gate_up, w_down):
        preact = x @ w_gate_up.T
        return (F.silu(preact[:, 0::2]) * preact[:, 1::2]) @ w_down.T, preact

    def backward(dout, x, w_gate_up, w_down, preact):
        gate, up = preact[:, 0::2].float(), preact[:, 1::2].float()
        dpost, sig = (dout @ w_down).float(), torch.sigmoid(gate)
        dgate, dup = dpost * up * sig * (1 + gate * (1 - sig)), dpost * gate * sig
        dpreact = torch.stack([dgate, dup], dim=2).flatten(1).to(x.dtype)
        return dpreact @ w_gate_up, dpreact.T @ x, dout.T @ (gate * sig * up).to(x.dtype)

    swiglu.swiglu_mlp_fwd.register_kernel("cpu")(forward)
    swiglu.swiglu_mlp_bwd.register_kernel("cpu")(backward)


def saved_bytes(variant: str, tokens: int) -> int:
    """Distinct bytes saved for backward by one layer's forward over `tokens` tokens."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**SHAPE, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).to(torch.bfloat16)
    if variant.endswith("fused_mlp"):
        from train.kernels import swiglu
        swiglu.use_fused_swiglu([layer.mlp])
    if (recipe := FP8_RECIPES.get(variant.split("+")[-1])) is not None:
        from train.kernels.float8 import convert_decoder_linears
        convert_decoder_linears([layer], recipe, fast_accum=True)
    forward = torch.compile(layer.forward, dynamic=True) if variant.startswith("compiled") else layer.forward
    x = torch.randn(1, tokens, SHAPE["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(tokens)[None]
    cos, sin = (t.to(torch.bfloat16) for t in LlamaRotaryEmbedding(config)(x, positions))
    skip = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), cos, sin)}
    seen: dict[int, int] = {}

    def record(t: torch.Tensor) -> None:
        if hasattr(t, "__tensor_flatten__"):  # a tensor subclass (float8): its inner tensors hold the bytes
            for name in t.__tensor_flatten__()[0]:
                record(getattr(t, name))
            return
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()

    def pack(t: torch.Tensor) -> torch.Tensor:
        record(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward(x, position_embeddings=(cos, sin), position_ids=positions)
    (out[0] if isinstance(out, tuple) else out).float().sum().backward()  # the graph ran end to end
    return sum(seen.values())


def planner_bytes(variant: str, tokens: int) -> int:
    """launcher/plan/activations.py's count for the same layer, K/V at the KV width (as CPU sdpa saves them)."""
    from contract.config import fp8_linears
    from contract.shape import ModelShape
    from launcher.plan.activations import layer_activation_bytes_per_token

    shape = ModelShape.from_arch(SHAPE)
    compiled = variant.startswith("compiled")
    recipe = FP8_RECIPES.get(variant.split("+")[-1])
    fused, fp8 = variant.endswith("fused_mlp"), fp8_linears(recipe, all_gather=False) if recipe else ""
    per_token = layer_activation_bytes_per_token(shape, 2, compiled, fused, fp8)
    if compiled:
        per_token -= 2 * 2 * (shape.q_dim - shape.kv_dim)
    weight_copy = 2 * 2 * shape.intermediate * shape.hidden if fused else 0
    return tokens * per_token + weight_copy


def measure(variant: str) -> dict:
    low, high = (saved_bytes(variant, t) for t in TOKENS)
    per_token = (high - low) / (TOKENS[1] - TOKENS[0])
    planned = (planner_bytes(variant, TOKENS[1]) - planner_bytes(variant, TOKENS[0])) / (TOKENS[1] - TOKENS[0])
    return {"variant": variant, "bytes_per_token": per_token, "bytes_per_layer": low - per_token * TOKENS[0],
            "planner_bytes_per_token": planned,
            "planner_bytes_per_layer": planner_bytes(variant, TOKENS[0]) - planned * TOKENS[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if any(v.endswith("fused_mlp") for v in args.variants):
        _register_cpu_swiglu()
    rows = [measure(v) for v in args.variants]
    print(f"{'variant':<22}{'B/token':>10}{'planner':>10}{'B/layer':>12}{'planner':>12}   (shape {SHAPE})")
    for r in rows:
        print(f"{r['variant']:<22}{r['bytes_per_token']:>10.0f}{r['planner_bytes_per_token']:>10.0f}"
              f"{r['bytes_per_layer']:>12.0f}{r['planner_bytes_per_layer']:>12.0f}")
    if args.out:
        args.out.write_text(json.dumps({"shape": SHAPE, "tokens": TOKENS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
