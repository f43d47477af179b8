"""Grouped experts (train/moe/experts.py) against transformers' own expert loop, fp32 on CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import GptOssConfig, Qwen3MoeConfig
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from train.moe.experts import (ExpertAdapters, ExpertLora, gpt_oss_layout, grouped_expert_mlp, routed_experts,
                               sort_by_expert)

TOL = 1e-5


def qwen3_block() -> Qwen3MoeSparseMoeBlock:
    config = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2)
    config._experts_implementation = "eager"  # transformers' loop: the reference
    block = Qwen3MoeSparseMoeBlock(config)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    return block


def gpt_oss_block() -> GptOssMLP:
    config = GptOssConfig(hidden_size=32, intermediate_size=24, num_local_experts=6, num_experts_per_tok=2)
    config._experts_implementation = "eager"
    block = GptOssMLP(config)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.5)  # large enough that the swiglu clamps bite
    return block


def test_qwen3_forward_and_gradients_equal_the_loop():
    torch.manual_seed(0)
    block = qwen3_block()
    x = torch.randn(40, 32, requires_grad=True)
    _, weights, index = block.gate(x.detach())
    weights = weights.detach()
    ref = block.experts(x, index, weights)
    ref_grads = torch.autograd.grad(ref.square().sum(), [x, block.experts.gate_up_proj, block.experts.down_proj])
    out = routed_experts(x, index, weights, block.experts.gate_up_proj, block.experts.down_proj)
    grads = torch.autograd.grad(out.square().sum(), [x, block.experts.gate_up_proj, block.experts.down_proj])
    assert (out - ref).abs().max() < TOL
    for got, want in zip(grads, ref_grads):
        assert (got - want).abs().max() < TOL * max(1.0, want.abs().max().item())


def test_gpt_oss_interleaved_clamped_swiglu_with_biases_equals_the_loop():
    torch.manual_seed(0)
    block = gpt_oss_block()
    experts = block.experts
    x = torch.randn(40, 32)
    _, weights, index = block.router(x)
    ref = experts(x, index, weights)
    out = routed_experts(x, index, weights, experts.gate_up_proj, experts.down_proj,
                         layout=gpt_oss_layout(experts.alpha, experts.limit),
                         gate_up_bias=experts.gate_up_proj_bias, down_bias=experts.down_proj_bias)
    assert ref.abs().max() > experts.limit  # the clamp was exercised
    assert (out - ref).abs().max() < TOL * ref.abs().max()


def test_lora_on_the_grouped_weights_equals_the_merged_weights():
    torch.manual_seed(0)
    block = qwen3_block()
    experts, rank, scale = block.experts, 4, 0.5
    num, two_inter, hidden = experts.gate_up_proj.shape
    adapters = ExpertAdapters(
        gate_up=ExpertLora(torch.randn(num, rank, hidden), torch.randn(num, two_inter, rank), scale),
        down=ExpertLora(torch.randn(num, rank, two_inter // 2), torch.randn(num, hidden, rank), scale))
    x = torch.randn(30, 32)
    _, weights, index = block.gate(x)
    adapted = routed_experts(x, index, weights, experts.gate_up_proj, experts.down_proj, adapters)
    merged_gate_up = experts.gate_up_proj + scale * adapters.gate_up.b @ adapters.gate_up.a
    merged_down = experts.down_proj + scale * adapters.down.b @ adapters.down.a
    merged = routed_experts(x, index, weights, merged_gate_up, merged_down)
    assert (adapted - merged).abs().max() < TOL * merged.abs().max()


def test_an_expert_without_tokens_and_the_segment_counts():
    top_k_index = torch.tensor([[0, 2], [2, 0], [3, 2]])
    perm, tokens_per_expert = sort_by_expert(top_k_index, num_experts=4)
    assert tokens_per_expert.tolist() == [2, 0, 3, 1]
    assert top_k_index.reshape(-1)[perm].tolist() == [0, 0, 2, 2, 2, 3]
    gate_up, down = torch.randn(4, 8, 16), torch.randn(4, 16, 4)
    out = grouped_expert_mlp(torch.randn(6, 16), tokens_per_expert, gate_up, down)
    assert out.shape == (6, 16)


@pytest.mark.parametrize("rows", [0])
def test_no_rows_at_all(rows):
    out = grouped_expert_mlp(torch.randn(rows, 16), torch.zeros(4, dtype=torch.long), torch.randn(4, 8, 16),
                             torch.randn(4, 16, 4))
    assert out.shape == (0, 16)
