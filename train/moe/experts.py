"""Routed experts as grouped matmuls: tokens sorted by expert, one grouped GEMM per projection.

transformers' own expert loop (``Qwen3MoeExperts.forward``) runs two small matmuls per expert per layer
and scatters back with ``index_add_``. Here the (token, expert) pairs are sorted by expert once, each
projection is ONE grouped matmul over the contiguous per-expert segments, and the routing weights are
applied before the pairs are put back in token order and summed over top-k (fp32-stable, deterministic:
no atomics). On CUDA the grouped matmul is torch's ``torch.nn.functional.grouped_mm`` (cuBLAS/CUTLASS grouped
GEMM, SM80+, bf16); on CPU, and wherever its 16-byte stride rule does not hold, it is an exact loop of
``F.linear`` over the same sorted segments — one function, dispatched on the device, so the CPU path is
the reference the GPU path is tested against (torch 2.13's CPU ``grouped_mm`` runs forward but has no
backward, so it is not used there).

What ``train/moe/expert_parallel.py`` (the ``ep`` helper) relies on, kept stable:

* ``grouped_expert_mlp(hidden_sorted [T, H], tokens_per_expert [E_local] int, gate_up, down, lora=None,
  *, layout=QWEN3) -> [T, H]``: rows of ``hidden_sorted`` are grouped by local expert in order
  (``tokens_per_expert[e]`` rows for expert e, summing exactly to T: drop EP sentinel rows before calling);
  no routing weights are applied here. Differentiable in everything it is given (autograd, no custom backward).
  ``gate_up``/``down`` are the module's own parameters: Qwen3-MoE layout ``[E, 2I, H]`` / ``[E, H, I]``
  (``layout=QWEN3``), gpt-oss ``[E, H, 2I]`` / ``[E, I, H]`` with biases and its clamped SwiGLU
  (``layout=gpt_oss_layout(alpha, limit)``). ``lora``: ``ExpertAdapters`` (per-expert A ``[E, r, in]``, B ``[E, out, r]``).
* ``sort_by_expert(top_k_index [N, k], num_experts) -> (perm [N*k], tokens_per_expert [E])``,
  ``gather_sorted(hidden [N, H], perm, k)``, ``combine_sorted(out_sorted [N*k, H], perm, top_k_weights [N, k])``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


@dataclass(frozen=True)
class ExpertLayout:
    """How one family stores its expert weights and gates them (transformers' own definitions)."""

    name: str
    transposed: bool  # weights stored [E, in, out] (gpt-oss) instead of [E, out, in] (Qwen3-MoE)
    gate: Callable[[Tensor], Tensor]  # [T, 2I] gate/up pre-activation -> [T, I]


def silu_gate(gate_up: Tensor) -> Tensor:
    """Qwen3-MoE / Mixtral: gate and up as concatenated halves, silu(gate) * up (``_default_apply_gate``)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def gpt_oss_gate(gate_up: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    """gpt-oss (``GptOssExperts._apply_gate``): interleaved gate/up columns, both clamped, (up + 1) * gate * sigmoid(alpha * gate)."""
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


QWEN3 = ExpertLayout("qwen3_moe", transposed=False, gate=silu_gate)


def gpt_oss_layout(alpha: float, limit: float) -> ExpertLayout:
    """gpt-oss's layout with its config's ``swiglu_alpha`` / ``swiglu_limit``."""
    return ExpertLayout("gpt_oss", transposed=True, gate=functools.partial(gpt_oss_gate, alpha=alpha, limit=limit))


@dataclass
class ExpertLora:
    """One projection's per-expert adapter: delta W_e = scale * B_e @ A_e, A [E, r, in], B [E, out, r]."""

    a: Tensor
    b: Tensor
    scale: float


@dataclass
class ExpertAdapters:
    """The adapters of one experts module (either may be absent)."""

    gate_up: ExpertLora | None = None
    down: ExpertLora | None = None


# --- routing: sort the (token, expert) pairs by expert, and put them back ---

def sort_by_expert(top_k_index: Tensor, num_experts: int) -> tuple[Tensor, Tensor]:
    """(perm, tokens_per_expert): ``perm`` orders the flattened [N*k] pairs by expert (stable, so a
    token's rows keep their order inside a segment); ids >= num_experts (EP sentinels) sort last and are
    not counted."""
    expert_ids = top_k_index.reshape(-1)
    perm = torch.argsort(expert_ids, stable=True)
    tokens_per_expert = torch.bincount(expert_ids.clamp(max=num_experts), minlength=num_experts + 1)[:num_experts]
    return perm, tokens_per_expert


def gather_sorted(hidden: Tensor, perm: Tensor, top_k: int) -> Tensor:
    """The token rows in expert order: row i of the result is token perm[i] // top_k."""
    return hidden[perm // top_k]


def combine_sorted(out_sorted: Tensor, perm: Tensor, top_k_weights: Tensor) -> Tensor:
    """Weight each pair by its routing weight, restore token order and sum over top-k -> [N, H]."""
    num_tokens, top_k = top_k_weights.shape
    weighted = out_sorted * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(out_sorted.dtype)
    unsorted = torch.empty_like(weighted)
    unsorted[perm] = weighted
    return unsorted.view(num_tokens, top_k, -1).sum(dim=1)


# --- the grouped matmul: one call per projection ---

def _grouped_kernel_fits(x: Tensor, weight_io: Tensor) -> bool:
    """torch's grouped GEMM: CUDA SM80+, 16-byte aligned strides (so dims a multiple of 8 in bf16)."""
    if x.device.type != "cuda" or not hasattr(F, "grouped_mm") or x.dtype != weight_io.dtype:
        return False
    step = 16 // x.element_size()
    return (torch.cuda.get_device_capability(x.device) >= (8, 0)
            and x.shape[-1] % step == 0 and weight_io.shape[-1] % step == 0)


def grouped_linear(x: Tensor, weight: Tensor, tokens_per_expert: Tensor, transposed: bool = False,
                   bias: Tensor | None = None) -> Tensor:
    """Row segment e of ``x`` times expert e's weight ([E, out, in], or [E, in, out] when ``transposed``),
    plus its bias [E, out]: one grouped GEMM on CUDA, an exact per-segment loop elsewhere."""
    weight_io = weight if transposed else weight.transpose(-2, -1)  # [E, in, out] view, no copy
    x = x.to(weight.dtype)
    if _grouped_kernel_fits(x, weight_io):
        offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)
        out = F.grouped_mm(x, weight_io, offs=offsets)
        if bias is not None:
            out = out + torch.repeat_interleave(bias, tokens_per_expert, dim=0, output_size=x.shape[0])
        return out
    counts = tokens_per_expert.tolist()
    pieces = []
    for expert, segment in enumerate(torch.split(x, counts)):
        if counts[expert]:
            pieces.append(segment @ weight_io[expert] + (bias[expert] if bias is not None else 0))
    if not pieces:
        return x.new_zeros(x.shape[0], weight_io.shape[-1])
    return torch.cat(pieces)


def lora_delta(x: Tensor, adapter: ExpertLora, tokens_per_expert: Tensor) -> Tensor:
    """scale * (x A_e^T) B_e^T per segment: two thin grouped GEMMs (rank r), never the [E, out, in] delta."""
    low = grouped_linear(x.to(adapter.a.dtype), adapter.a, tokens_per_expert)
    return grouped_linear(low, adapter.b, tokens_per_expert) * adapter.scale


def grouped_expert_mlp(hidden_sorted: Tensor, tokens_per_expert: Tensor, gate_up: Tensor, down: Tensor,
                       lora: ExpertAdapters | None = None, *, layout: ExpertLayout = QWEN3,
                       gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None) -> Tensor:
    """down(gate(gate_up(x))) of each row's expert, rows grouped by expert (see the module docstring)."""
    projected = grouped_linear(hidden_sorted, gate_up, tokens_per_expert, layout.transposed, gate_up_bias)
    if lora is not None and lora.gate_up is not None:
        projected = projected + lora_delta(hidden_sorted, lora.gate_up, tokens_per_expert).to(projected.dtype)
    activated = layout.gate(projected)
    out = grouped_linear(activated, down, tokens_per_expert, layout.transposed, down_bias)
    if lora is not None and lora.down is not None:
        out = out + lora_delta(activated, lora.down, tokens_per_expert).to(out.dtype)
    return out


def routed_experts(hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor, gate_up: Tensor, down: Tensor,
                   lora: ExpertAdapters | None = None, *, layout: ExpertLayout = QWEN3,
                   gate_up_bias: Tensor | None = None, down_bias: Tensor | None = None) -> Tensor:
    """The whole experts forward on one device: route, grouped MLP, combine. [N, H] -> [N, H]."""
    num_experts = gate_up.shape[0]
    perm, tokens_per_expert = sort_by_expert(top_k_index, num_experts)
    hidden_sorted = gather_sorted(hidden, perm, top_k_index.shape[-1])
    out = grouped_expert_mlp(hidden_sorted, tokens_per_expert, gate_up, down, lora, layout=layout,
                             gate_up_bias=gate_up_bias, down_bias=down_bias)
    return combine_sorted(out, perm, top_k_weights).to(hidden.dtype)
