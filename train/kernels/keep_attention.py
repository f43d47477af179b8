"""train.recompute_attention = false: per-layer checkpointing that keeps the attention kernel's outputs.

Per-layer activation checkpointing recomputes each decoder layer's whole forward in backward, attention
included. At long documents attention is most of the FLOPs (~75% of an 8B LoRA step at 128k tokens),
and its forward recompute is a quarter of the attention work the backward adds (forward 1, backward ~2,
recompute 1). Selective activation checkpointing (torch.utils.checkpoint's `context_fn`) lets the
checkpoint keep the outputs of chosen ops from the forward: the recompute in backward then reads them
from the checkpoint's store instead of running the op again. The policy here keeps the attention
kernels' outputs (the output [T, H, D] and the fp32 log-sum-exp [H, T] the backward needs, plus what
else the op returns) and recomputes everything else.

Which op each backend (train/kernels/attention.py) runs, as the checkpoint's dispatch mode sees it:
  fa4         torch.ops.sft.fa4_varlen_fwd (our custom op, train/kernels/fa4.py)
  flash_attn  torch.ops.flash_attn._flash_attn_varlen_forward (the flash-attn package's custom op, >= 2.6)
  varlen      torch.ops.torch_attn._varlen_attn (torch's custom op around aten._flash_attention_forward)
  sdpa        F.scaled_dot_product_attention picks one fused aten op (CUDA flash/efficient/cuDNN, or the
              CPU flash kernel); its math fallback decomposes into plain matmuls and softmax, which this
              policy recomputes as before (no single op to keep)
Ops are matched by name so that an uninstalled package's op needs no import.

What it composes with (tests/train/test_keep_attention.py): HF's `gradient_checkpointing_enable(
gradient_checkpointing_kwargs=...)` passes `context_fn` on to torch.utils.checkpoint.checkpoint
(non-reentrant only: torch refuses it with the reentrant variant, which we never use); train.mlp_chunk_tokens'
nested checkpoints; train.activation_offload's saved-tensor hooks, which never see the kept outputs: the
checkpoint holds them in its own store, so they stay on the GPU (the planner counts them there,
launcher/plan/activations.py). torch.compile'd decoder layers (the checkpoint stays outside the compiled
forward): on CPU (torch 2.13) the custom op ran once per layer there too, with equal gradients; on GPUs the
GPU test (tests/train/test_gpu_keep_attention.py) checks it. The API (create_selective_checkpoint_contexts,
CheckpointPolicy) is spelled the same from torch 2.4 to 2.13.
"""

from __future__ import annotations

import functools
from typing import Any

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# "namespace.op" of every attention forward that runs as one op with its own backward.
ATTENTION_OPS = frozenset({
    "sft.fa4_varlen_fwd",
    "flash_attn._flash_attn_varlen_forward",
    "flash_attn._flash_attn_forward",
    "torch_attn._varlen_attn",
    "aten._flash_attention_forward",
    "aten._efficient_attention_forward",
    "aten._scaled_dot_product_flash_attention",
    "aten._scaled_dot_product_efficient_attention",
    "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_flash_attention_for_cpu",
})


def op_name(op: Any) -> str:
    """'namespace.name' of an OpOverload (torch.ops.aten.mm.default -> 'aten.mm')."""
    packet = getattr(op, "overloadpacket", op)
    return f"{getattr(packet, '_qualified_op_name', str(packet)).replace('::', '.')}"


def keep_attention_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep the attention kernels' outputs from the forward; recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op_name(op) in ATTENTION_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def checkpoint_kwargs(recompute_attention: bool) -> dict[str, Any]:
    """torch.utils.checkpoint.checkpoint's keyword arguments for per-layer checkpointing (non-reentrant:
    frozen inputs under LoRA, FSDP2 and keyword arguments all need it)."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if not recompute_attention:
        # A fresh pair of contexts (and store) for every checkpointed call: torch calls context_fn each time.
        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, keep_attention_policy)
    return kwargs

