"""Llama attention kept token-major ([T, heads, D]) from the projections through RoPE into a varlen kernel.

transformers' LlamaAttention turns each projection [1, T, heads*D] into [1, heads, T, D] with a
transpose, applies RoPE in that order, and our varlen kernels (train/kernels/attention.py) transpose
back to [T, heads, D]. In inductor's code for that order (read on CPU) rotate_half's concatenation is
written head-major and read back token-major: a transposing round trip over q and k in every layer.
In the 8B profile on 4 x H100 (10,240 tokens per GPU) the forward and backward RoPE kernels took
1.05 ms a layer, 3.5% of the step, several times what reading and writing q and k once costs.

Here q, k and v stay in the order the projections write them. The arithmetic is transformers' own
(q * cos + rotate_half(q) * sin, in the activations' dtype), so only the memory order changes.
Installed per instance (no class is patched) on plain LlamaAttention modules when the model runs one
of the varlen kernels; a call that brings a KV cache goes to transformers' forward unchanged.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from transformers.models.llama.modeling_llama import LlamaAttention

from train.kernels.attention import NEEDS_PACKED, half_dtype, varlen_lengths

VarlenKernel = Callable[..., torch.Tensor]  # (q, k, v, cu_q, cu_k, max_q, max_k, scaling, dropout) -> [T, H, D]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """transformers' rotate_half: [-x2, x1] over the last dimension's halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_token_major(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q [T, H, D] and k [T, H_kv, D] with cos/sin [1, T, D] (transformers' position embeddings)."""
    cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, D]: one row per token, broadcast over heads
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def token_major_forward(kernel: VarlenKernel) -> Callable[..., tuple[torch.Tensor, None]]:
    """A LlamaAttention.forward for packed batches (batch 1) that calls `kernel` on token-major tensors."""

    def forward(self: LlamaAttention, hidden_states: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        if kwargs.get("past_key_values") is not None or kwargs.get("cache") is not None:
            return LlamaAttention.forward(self, hidden_states, position_embeddings, attention_mask, **kwargs)
        tokens = hidden_states.shape[1]
        if hidden_states.shape[0] != 1:
            raise ValueError(NEEDS_PACKED)
        q, k, v = (proj(hidden_states).view(tokens, -1, self.head_dim)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope_token_major(q, k, *position_embeddings)
        dtype = half_dtype(q)
        cu_q, cu_k, max_q, max_k = varlen_lengths(kwargs, hidden_states.device)
        dropout = self.attention_dropout if self.training else 0.0
        out = kernel(q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k, max_q, max_k, self.scaling, dropout)
        return self.o_proj(out.reshape(1, tokens, -1)), None

    return forward


def use_token_major_attention(attentions: list[torch.nn.Module], kernel: VarlenKernel) -> int:
    """Route each plain LlamaAttention's forward through `kernel` token-major; returns how many."""
    plain = [attn for attn in attentions if type(attn) is LlamaAttention]
    forward = token_major_forward(kernel)
    for attn in plain:
        attn.forward = types.MethodType(forward, attn)
    return len(plain)
