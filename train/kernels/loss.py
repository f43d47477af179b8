"""Causal-LM loss computed from hidden states, without materialising the full logits.

With a 128k vocabulary, a 32k-token packed micro-batch has 32k x 128k logits: 8 GiB in bf16 and
16 GiB more for the fp32 log-softmax. Fusing the lm_head matmul with the cross-entropy avoids that:
- "fused" (the default on CUDA): chunks of FUSED_LOSS_CHUNK_TOKENS (contract.shape); each chunk's
  logits give its loss and, in the same forward, the gradients of hidden and weight (one pass over
  the logits for softmax and gradient), so nothing vocabulary-sized outlives its chunk and the
  lm_head matmul runs once. It is Liger Kernel's scheme with larger chunks and no host sync:
  Liger sizes chunks from V/d (1,024 tokens at 32k tokens and Llama-3's vocabulary), where cuBLAS
  runs the three lm_head matmuls ~10% slower than at 4,096 (bench/gpu_ceilings.py), and its
  backward reads grad_output back to the host every step. Measured +1.7% tokens/s in issue #13 (file
  removed in #33, no provenance).
  The softmax/gradient pass is quack's cross-entropy kernel on Hopper/Blackwell when quack-kernels
  is installed (it comes with flash-attn-4): a thread-block cluster holds a whole 128k-entry row in
  shared memory, so the logits are read once and their gradient overwrites them in place. Elsewhere
  it is a torch.compile'd pass, which reads the logits twice and writes a new gradient tensor.
- "liger": Liger Kernel's fused linear cross-entropy (Triton), when installed;
- "chunked" (CPU default): each chunk's logits and loss under activation checkpointing (the lm_head
  matmul runs twice; no compiled kernel needed).

All return the *sum* of token losses; the loop divides by the step's label-token count across
micro-batches and ranks (correct normalisation under gradient accumulation).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from contract.gpus import quack_runs_on
from contract.shape import FUSED_LOSS_CHUNK_TOKENS

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
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
    chunk_tokens: int = FUSED_LOSS_CHUNK_TOKENS,
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


def _ce_sum_and_logit_grad(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ CE over the chunk's labelled tokens and its gradient w.r.t. the logits (softmax − one-hot,
    zero on ignored tokens), in the logits' dtype. Compiled on CUDA, where inductor fuses the fp32
    upcast into its kernels (eager on the CPU, where tests run it)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 logits: softmax in fp32
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    valid = (targets != IGNORE_INDEX).unsqueeze(-1)
    safe = torch.where(valid.squeeze(-1), targets, 0).unsqueeze(-1)
    loss = torch.where(valid, lse - x.gather(-1, safe), 0.0).sum()
    is_target = torch.arange(x.shape[-1], device=x.device) == safe
    grad = torch.where(valid, torch.exp(x - lse) - is_target.to(x.dtype), 0.0)
    return loss, grad.to(logits.dtype)


def _quack_ce_in_place(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_ce_sum_and_logit_grad with quack's kernel: the gradient overwrites the logits."""
    loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    importlib.import_module("quack.cross_entropy").cross_entropy_fwd_out(
        logits, targets, None, loss, None, logits, None, ignore_index=IGNORE_INDEX)
    return loss.sum(), logits


@functools.cache
def logit_grad_pass(device: torch.device) -> str:
    """Which softmax/gradient pass the fused loss runs on `device`: "quack" or "compiled" (CUDA
    without quack's kernel), "eager" (CPU)."""
    if device.type != "cuda":
        return "eager"
    if quack_runs_on(torch.cuda.get_device_capability(device)):
        try:
            importlib.import_module("quack.cross_entropy")
            return "quack"
        except ImportError:
            pass
    return "compiled"


@functools.cache
def _compiled_ce():
    return torch.compile(_ce_sum_and_logit_grad, dynamic=True)


def _ce_pass(device: torch.device):
    kind = logit_grad_pass(device)
    if kind == "quack":
        return _quack_ce_in_place
    return _compiled_ce() if kind == "compiled" else _ce_sum_and_logit_grad


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss sum and both gradients chunk by chunk; backward only scales them."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        ce = _ce_pass(hidden.device)
        loss = torch.zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        # Only what autograd will ask for: a LoRA run's frozen lm_head needs no weight gradient.
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]
            chunk_loss, grad_logits = ce(h @ weight.t(), t)
            loss += chunk_loss
            if grad_hidden is not None:
                torch.mm(grad_logits, weight, out=grad_hidden[start : start + chunk_tokens])
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t(), h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Always scale (no host sync to test for 1.0); grad_loss is 1 / label tokens of the step.
        return *(None if g is None else g * grad_loss.to(g.dtype) for g in ctx.saved_tensors), None, None


def fused_linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                   chunk_tokens: int = FUSED_LOSS_CHUNK_TOKENS) -> torch.Tensor:
    """Σ CE of hidden [T, d] @ weight [V, d]ᵀ against targets [T], gradients computed in the forward.
    Without autograd (eval) only the loss is computed."""
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        with torch.no_grad():
            return chunked_linear_cross_entropy_sum(hidden, weight, targets, chunk_tokens)
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens)


def linear_cross_entropy_sum(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, backend: str = "auto",
    shifted: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum of next-token CE for hidden [B, T, d] projected by weight [V, d] against labels [B, T].
    `shifted`: the targets already shifted, used instead of shift_labels(labels) (a context-parallel
    slice's last token predicts the next rank's first: train/kernels/context_parallel.py).

    backend: "auto" (fused on CUDA, chunked elsewhere), "fused", "liger", "chunked", "dense".
    """
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = (shift_labels(labels) if shifted is None else shifted).reshape(-1)
    if backend == "auto":
        backend = "fused" if hidden.is_cuda else "chunked"
    if backend == "fused":
        return fused_linear_cross_entropy_sum(flat_hidden, weight, targets)
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
