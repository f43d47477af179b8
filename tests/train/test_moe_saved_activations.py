"""The planner's grouped-expert MoE block count (launcher/plan/activations.py `mlp_bytes_per_token`) against the
tensors one tiny bf16 Qwen3-MoE block really saves for backward on CPU: our experts (train/moe/hf.py
"sft_grouped") behind the fp32 router (train/moe/router.py), under `torch.autograd.graph.saved_tensors_hooks`.
Distinct storages summed at two token counts; the slope is the per-token cost the planner counts."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from contract.shape import ModelShape
from launcher.plan.activations import mlp_bytes_per_token
from train.moe.hf import use_grouped_experts
from train.moe.router import routers_in_fp32

ARCH = dict(model_type="qwen3_moe", vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, norm_topk_prob=True)
TOKENS = (256, 512)


def _block() -> torch.nn.Module:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**{k: v for k, v in ARCH.items() if k != "model_type"})
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    assert use_grouped_experts(model) == 1 and routers_in_fp32(model) == 1  # as train/engine/model.py sets it up
    block = model.model.layers[0].mlp
    for weight in (block.gate.weight, block.experts.gate_up_proj, block.experts.down_proj):
        torch.nn.init.normal_(weight, std=0.5)  # every expert gets tokens at both sizes
    return block


def _saved_bytes(block: torch.nn.Module, tokens: int) -> int:
    x = torch.randn(1, tokens, ARCH["hidden_size"], dtype=torch.bfloat16, requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), x)}  # the input is the layer's to count
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if (ptr := t.untyped_storage().data_ptr()) not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    out.float().sum().backward()  # the graph ran end to end
    assert x.grad is not None and block.experts.down_proj.grad is not None
    return sum(seen.values())


def test_moe_block_saves_what_the_planner_counts_per_token():
    block = _block()
    low, high = (_saved_bytes(block, t) for t in TOKENS)
    measured = (high - low) / (TOKENS[1] - TOKENS[0])
    planned = mlp_bytes_per_token(ModelShape.from_arch(ARCH), elem=2)
    assert measured == planned, (measured, planned)  # exact: every saved tensor is per token or per layer
    per_layer = low - measured * TOKENS[0]
    assert per_layer == 4 * ARCH["num_experts"] * ARCH["hidden_size"]  # the router's fp32 weight copy, not planned


def test_the_planner_knows_which_families_route_in_fp32():
    from contract.families import FAMILIES
    from train.moe.router import ROUTERS

    assert {name for name, family in FAMILIES.items() if family.fp32_router} == set(ROUTERS)
