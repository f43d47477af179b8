"""Causal-LM loss computed from hidden states, without materialising the full logits.

With a 128k vocabulary, a 32k-token packed micro-batch has 32k x 128k logits: 8 GiB in bf16 and
16 GiB more for the fp32 log-softmax. Fusing the lm_head matmul with the cross-entropy avoids that:
- Liger Kernel's fused linear cross-entropy (Triton, CUDA) when it is installed: it computes the
  gradient chunk by chunk during the forward, so nothing vocabulary-sized is kept;
- otherwise a chunked fallback: each chunk of tokens gets its logits and loss under activation
  checkpointing, so only one chunk's logits exist at a time (the lm_head matmul runs twice).

Both return the *sum* of token losses; the loop divides by the step's label-token count across
micro-batches and ranks (correct normalisation under gradient accumulation).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Token t predicts token t+1: targets are labels shifted left, -100 at the end of each row.

    Packing puts documents back to back, so the collator sets the first label of every document
    to -100: the last token of document j-1 is then never trained to predict document j.
    """
    return F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)


@functools.cache
def _liger_flce():
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        return None
    return liger_fused_linear_cross_entropy


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = hidden @ weight.t()
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 4096
) -> torch.Tensor:
    """Sum of CE over tokens, one checkpointed chunk at a time (bounded logits memory)."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start : start + chunk_tokens]
        t = targets[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_loss_sum, h, weight, t, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(h, weight, t)
    return total


def linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, backend: str = "auto"
) -> torch.Tensor:
    """Sum of next-token CE for hidden [B, T, d] projected by weight [V, d] against labels [B, T].

    backend: "auto" (liger on CUDA when installed, else chunked), "liger", "chunked", "dense".
    """
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = shift_labels(labels).reshape(-1)
    if backend == "auto":
        backend = "liger" if hidden.is_cuda and _liger_flce() is not None else "chunked"
    if backend == "liger":
        flce = _liger_flce()
        if flce is None:
            raise RuntimeError("loss backend 'liger' needs the liger-kernel package")
        return flce(flat_hidden, weight, targets, ignore_index=IGNORE_INDEX, reduction="sum")
    if backend == "chunked":
        return chunked_linear_cross_entropy_sum(flat_hidden, weight, targets)
    if backend == "dense":
        return _chunk_loss_sum(flat_hidden, weight, targets)
    raise ValueError(f"unknown loss backend {backend!r}")
