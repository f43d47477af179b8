"""Memory for long sequences on one GPU: what grows with the sequence, moved off the GPU or cut into tiles.

With per-layer checkpointing a step keeps each decoder layer's input (L x T x d: 64 GiB for 8B at 256k
tokens in bf16) and, while one layer is recomputed in backward, that layer's activations, of which the
MLP's intermediate (T x 14,336 several times for 8B) is the largest. So:

- `train.activation_offload`: the tensors autograd saves during the forward (under checkpointing: each
  layer's input, which non-reentrant checkpointing saves as a saved tensor, so saved-tensor hooks see it)
  are copied to pinned CPU memory on a side stream (overlapped with the next layers' compute) and copied
  back when the backward reaches them. The recompute in backward runs outside these hooks: what it saves
  stays on the GPU for the moment it is needed. Small tensors (< OFFLOAD_MIN_BYTES) stay where they are.
  On the CPU (tests) the copy is a plain one: the same code path, nothing saved.
- `train.mlp_chunk_tokens`: each decoder layer's MLP runs over the sequence in chunks of that many tokens,
  each under non-reentrant checkpointing, so its intermediate exists for one chunk at a time (forward,
  the layer's recompute and backward alike); costs one more MLP forward per chunk in backward.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

OFFLOAD_MIN_BYTES = 1 << 20  # below this the copy's latency outweighs the memory


class ActivationOffload:
    """Saved-tensor hooks that keep the forward's saved activations in (pinned) CPU memory; see the module doc."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Around a forward: what it saves for backward goes to the CPU."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield

    def pack(self, tensor: torch.Tensor) -> Any:
        if tensor.numel() * tensor.element_size() < OFFLOAD_MIN_BYTES or isinstance(tensor, torch.nn.Parameter):
            return tensor
        if self.stream is None or tensor.device.type != "cuda":
            return tensor.device, tensor.detach().to("cpu", copy=True), None
        host = torch.empty(tensor.shape, dtype=tensor.dtype, layout=tensor.layout, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the tensor is written
        with torch.cuda.stream(self.stream):
            host.copy_(tensor.detach(), non_blocking=True)
        tensor.record_stream(self.stream)  # its GPU memory is not reused before the copy has read it
        return tensor.device, host, self.stream.record_event()

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host, copied = packed
        if copied is not None:
            torch.cuda.current_stream(device).wait_event(copied)
        return host.to(device, non_blocking=copied is not None)


@torch.compiler.disable  # eager inside a compiled layer (a graph break): the chunks' checkpoints stay torch's own
def _chunked_mlp(self: torch.nn.Module, hidden: torch.Tensor, *, forward: Any, chunk_tokens: int) -> torch.Tensor:
    """The MLP over [..., T, d] in chunks of `chunk_tokens` along T, each checkpointed."""
    length = hidden.shape[-2]
    if length <= chunk_tokens:
        return forward(hidden)
    parts = []
    for start in range(0, length, chunk_tokens):
        piece = hidden.narrow(-2, start, min(chunk_tokens, length - start))
        parts.append(checkpoint(forward, piece, use_reentrant=False) if torch.is_grad_enabled() else forward(piece))
    return torch.cat(parts, dim=-2)


def chunk_mlps(mlps: list[torch.nn.Module], chunk_tokens: int) -> int:
    """Run each MLP module over chunks of `chunk_tokens` tokens (an instance's forward, no class patched:
    parameter names, FSDP units and checkpoints stay as they were); returns how many."""
    for mlp in mlps:
        bound = functools.partial(_chunked_mlp, forward=mlp.forward, chunk_tokens=chunk_tokens)
        mlp.forward = types.MethodType(bound, mlp)
    return len(mlps)
