"""Context parallelism (parallel.context = N): one packed sequence split across N GPUs, Ulysses style.

Why Ulysses (DeepSpeed-Ulysses' all-to-all over heads), not ring attention or torch's experimental
`context_parallel`: our attention is a packed *varlen* kernel (FA4, FA2, torch varlen, the CPU's
block-diagonal sdpa) driven by one `cu_seqlens` for the whole row. After an all-to-all each rank holds
the WHOLE sequence for H/N of the heads, so the existing kernel runs unchanged with the full
`cu_seqlens`: documents keep their own attention across the split, and a document that crosses a rank
boundary needs nothing special. Ring attention would need a varlen kernel that returns and merges
log-sum-exps per block pair and per document; torch's `context_parallel` handles SDPA only. Ulysses'
cost: two all-to-alls of q/k/v/out per layer (volume per GPU independent of N), and N must divide the
query heads (Llama-3 8B/70B: 32/64 heads, so N <= 32).

Layout. The world is split into CP groups of N consecutive ranks; the ranks of one group read the same
micro-batch (data-parallel degree world / N, so the data position and resume stay as without CP), and
FSDP2 shards over every rank of the world (torchtitan's flattened dp_shard x cp mesh): FSDP needs no
knowledge of the split. Each CP rank holds a contiguous 1/N slice of the packed row (padded to a
multiple of N with a filler segment that has no labels), with the global per-document positions, so
RoPE rotates its slice as in the whole row. Labels are shifted before the split (`shift_labels`): the
last token of a slice predicts the first token of the next rank's slice.

Loss. Each rank's loss is its slice's token-loss sum over (label tokens of the step, all ranks) / world;
FSDP2 averages gradients over the world, so the gradient is that of Σ token losses / label tokens,
exactly as without CP (train/engine/loop.py's normalisation, unchanged). The all-to-all's backward is
an all-to-all, so each rank's parameter gradients are those of its own slice's computation.

Per-head parameters the model passes to attention (gpt-oss's sinks, `s_aux`) are sliced to the rank's
heads; the sliding window (`sliding_window`) is per layer, not per head, and passes through unchanged.

GQA: the key/value heads are split like the query heads when N divides them; with fewer KV heads than
N (Llama-3 8B has 8, so N = 16 or 32) each KV head is repeated N / H_kv times first, so every rank
still receives the one KV head its query heads read (more all-to-all volume for k/v, nothing else).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from contract.parallel import context_blocker
from contract.schema import ConfigError

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
KEY = "parallel.context"


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place: CP group of `size` consecutive ranks, `rank` within it (size 1: off)."""

    size: int = 1
    rank: int = 0
    group: Any = None  # the ProcessGroup of this rank's CP group; None when off

    @property
    def enabled(self) -> bool:
        return self.size > 1

    def data_world(self, world: int) -> int:
        """Ranks that read different micro-batches: one per CP group."""
        return world // self.size

    def data_rank(self, rank: int) -> int:
        return rank // self.size

    def shard(self, batch: dict[str, Any], filler_id: int = 0) -> dict[str, Any]:
        """This rank's slice of a packed micro-batch (identity when off); see the module doc."""
        return shard_packed(batch, self.size, self.rank, filler_id) if self.enabled else batch


def setup(size: int, world: int, rank: int, heads: int, kv_heads: int) -> ContextParallel:
    """The CP groups of `size` consecutive ranks (every rank creates every group, as new_group needs);
    a ConfigError (exit 2) when `size` cannot split the ranks or the model's heads."""
    if size <= 1:
        return ContextParallel()
    if blocker := context_blocker(size, world, heads, kv_heads):
        raise ConfigError(f"{KEY}: {blocker}", KEY)
    groups = [dist.new_group(list(range(start, start + size))) for start in range(0, world, size)]
    logger.info("context parallel: %d groups of %d ranks (data-parallel degree %d); rank %d holds slice %d",
                world // size, size, world // size, rank, rank % size)
    return ContextParallel(size, rank % size, groups[rank // size])


def shard_packed(batch: dict[str, Any], size: int, rank: int, filler_id: int = 0) -> dict[str, Any]:
    """Slice `rank` of `size` of a packed row from train.dataset.packing.collate_packed: padded to a
    multiple of `size` with a label-free filler segment, labels shifted before slicing (`shift_labels`;
    `labels` carries the same, so the model computes a loss), cu_seq_lens kept whole."""
    if "cu_seq_lens_q" not in batch:
        raise ValueError("context parallelism needs packed batches (data.packing = true)")
    length = batch["input_ids"].shape[-1]
    pad = -length % size
    ids, positions, labels = batch["input_ids"], batch["position_ids"], batch["labels"]
    cu = batch["cu_seq_lens_q"]
    if pad:
        ids = F.pad(ids, (0, pad), value=filler_id)
        positions = torch.cat([positions, torch.arange(pad, dtype=positions.dtype).unsqueeze(0)], dim=-1)
        labels = F.pad(labels, (0, pad), value=IGNORE_INDEX)
        cu = torch.cat([cu, cu.new_tensor([length + pad])])
    targets = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)
    part = (length + pad) // size
    piece = slice(rank * part, (rank + 1) * part)
    max_length = max(int(batch["max_length_q"]), pad)
    return {
        "input_ids": ids[..., piece], "position_ids": positions[..., piece],
        "labels": targets[..., piece], "shift_labels": targets[..., piece],
        "cu_seq_lens_q": cu, "cu_seq_lens_k": cu.clone(), "max_length_q": max_length, "max_length_k": max_length,
    }


def label_tokens(batch: dict[str, Any]) -> int:
    """Label tokens of a micro-batch on this rank (CP: of its slice; its targets are already shifted)."""
    if "shift_labels" in batch:
        return int((batch["shift_labels"] != IGNORE_INDEX).sum())
    return int((batch["labels"][..., 1:] != IGNORE_INDEX).sum())


def _all_to_all(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Chunk j of dim 0 goes to rank j; dim 0 of the result is the chunks in source-rank order.
    Autograd-aware (its backward is the same all-to-all) and traceable by torch.compile; gloo and NCCL."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    out = all_to_all_single_autograd(x.contiguous(), None, None, group)
    return out.wait() if hasattr(out, "wait") else out


def heads_to_sequence(x: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """[T/N, H, D] (a slice of the sequence, all heads) -> [T, H/N, D] (the whole sequence, a head group)."""
    local, heads, dim = x.shape
    chunks = x.reshape(local, size, heads // size, dim).transpose(0, 1)  # [N, T/N, H/N, D]: chunk j to rank j
    return _all_to_all(chunks, group).reshape(size * local, heads // size, dim)


def sequence_to_heads(x: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """The inverse: [T, H/N, D] -> [T/N, H, D]."""
    length, heads, dim = x.shape
    received = _all_to_all(x.reshape(size, length // size, heads, dim), group)  # [N (head group), T/N, H/N, D]
    return received.transpose(0, 1).reshape(length // size, size * heads, dim)


def ulysses_attention(inner: Callable[..., tuple[torch.Tensor, Any]], cp: ContextParallel) -> Callable[..., Any]:
    """transformers' attention function `inner` run over the whole sequence for H/N heads on each rank."""

    def forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        heads, kv_heads = query.shape[1], key.shape[1]
        if kv_heads % cp.size:  # fewer KV heads than ranks: each rank gets the one its query heads use
            key = key.repeat_interleave(cp.size // kv_heads, dim=1)
            value = value.repeat_interleave(cp.size // kv_heads, dim=1)
        q, k, v = (heads_to_sequence(t[0].transpose(0, 1), cp.size, cp.group).transpose(0, 1).unsqueeze(0)
                   for t in (query, key, value))
        kwargs.pop("position_ids", None)  # this rank's slice only; the documents come from cu_seq_lens
        if kwargs.get("s_aux") is not None:  # per-head sinks (gpt-oss): this rank's heads only
            share = heads // cp.size
            kwargs["s_aux"] = kwargs["s_aux"][cp.rank * share:(cp.rank + 1) * share]
        out, _ = inner(module, q, k, v, attention_mask, **kwargs)  # [1, T, H/N, D]
        if out.shape[2] * cp.size != heads:
            raise ValueError(f"attention returned {out.shape[2]} heads for {heads} // {cp.size}")
        return sequence_to_heads(out[0], cp.size, cp.group).unsqueeze(0), None

    return forward


def register_attention(registered: str, cp: ContextParallel) -> str:
    """Register the Ulysses wrapper of transformers' attention function `registered`; returns its name
    (unchanged when CP is off). The name keeps ours' rule: no "flash", "sdpa" or "flex" in it."""
    if not cp.enabled:
        return registered
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = f"sft_cp{cp.size}_{registered.removeprefix('sft_')}"
    AttentionInterface.register(name, ulysses_attention(ALL_ATTENTION_FUNCTIONS[registered], cp))
    logger.info("attention: %s split over %d ranks (Ulysses all-to-all over heads)", registered, cp.size)
    return name
