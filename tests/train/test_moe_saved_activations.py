"""The planner's grouped-expert MoE block count (launcher/plan/activations.py `mlp_bytes_per_token`) against the
tensors one tiny bf16 Qwen3-MoE block really saves for backward on CPU: our experts (train/moe/hf.py
"sft_grouped") behind the fp32 router (train/moe/router.py), under `torch.autograd.graph.saved_tensors_hooks`.
Distinct storages summed at two token counts; the slope is the per-token cost the planner counts. And the
forward's transient peak (the fp32 combine, `moe_combine_bytes`): every op's output storage tracked under a
TorchDispatchMode until its last tensor dies (CPU has no allocator statistics)."""

from __future__ import annotations

import collections
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from contract.shape import ModelShape
from launcher.plan.activations import mlp_bytes_per_token, moe_combine_bytes
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


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages that ops created and some tensor still holds; `peak` their maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.refs: collections.Counter[int] = collections.Counter()
        self.sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (ptr := t.untyped_storage().data_ptr()):
                if ptr not in self.sizes:
                    self.sizes[ptr] = t.untyped_storage().nbytes()
                    self.live += self.sizes[ptr]
                self.refs[ptr] += 1
                weakref.finalize(t, self._drop, ptr)
        self.peak = max(self.peak, self.live)
        return out

    def _drop(self, ptr: int) -> None:
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            del self.refs[ptr]
            self.live -= self.sizes.pop(ptr)


def test_moe_block_forward_transient_is_the_fp32_combine():
    block, rows = _block(), {}
    for tokens in TOKENS:
        x = torch.randn(1, tokens, ARCH["hidden_size"], dtype=torch.bfloat16)
        with LiveBytes() as tracker:
            out = block(x.requires_grad_())
        rows[tokens] = tracker.peak - tracker.live  # above what the forward leaves: saved tensors + the output
        del out
    measured = (rows[TOKENS[1]] - rows[TOKENS[0]]) / (TOKENS[1] - TOKENS[0])
    planned = moe_combine_bytes(ModelShape.from_arch(ARCH), 1)
    k = ARCH["num_experts_per_tok"]
    # the rest: the combine's index scratch (the weights in expert order, int64 ids), a few bytes per k
    assert planned <= measured <= planned + 32 * k, (measured, planned)
