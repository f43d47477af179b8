"""FlashAttention-4 (the `flash-attn-4` package, CuTe DSL kernels for Hopper and Blackwell) as an
opaque torch op.

Why a custom op: torch.compile traces into a Python-level kernel launcher and did not finish
compiling a decoder layer that called `flash_attn.cute.flash_attn_varlen_func` in 4 minutes, and
torch 2.11's own FA4 hook (`activate_flash_attention_impl("FA4")`) failed with 4.0.0b36. Wrapped as
`torch.library.custom_op`s (forward and backward, each with a fake implementation that only gives
shapes), the compiled graph keeps attention as one call and never looks inside.

The forward/backward entry points are the package's `_flash_attn_fwd` / `_flash_attn_bwd`, the
functions its own autograd.Function calls (the public function hides the log-sum-exp the backward
needs). They are private, so `unavailable()` checks that they exist with the arguments used here.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import torch

from contract.gpus import ATTENTION_MIN_CAPABILITY

FWD_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal", "return_lse",
            "window_size_left", "window_size_right"}
BWD_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "deterministic", "window_size_left",
            "window_size_right"}
MIN_CAPABILITY, MAX_CAPABILITY = ATTENTION_MIN_CAPABILITY["fa4"], (12, 99)  # Hopper (sm90) to Blackwell (sm120)
# FA4 compiles a separate kernel variant when the longest sequence fits one tile (its backward's
# `single_k_block`, the forward's `max_m_blocks_leq_one`; tiles of 64-128 rows, 2 Q tiles on
# Blackwell, 4 query heads a row under packed GQA). A pack of only short documents then JIT-compiled
# that variant mid-run, on one rank: 3.2 s at step 43 of the 8B run on 4 H100s (a pack of 104
# documents, the longest 96 tokens) while the other ranks waited. The max lengths only size the
# launch grid, so one floor above every such tile keeps a single variant; the extra tiles exit at once.
# The floor is applied inside the ops, where the lengths are plain ints: applied in the compiled layer,
# max(512, max_length_q) became guards on max_length_q (`<= 512`, `max(512, ..) == ..`) that failed at an
# FX graph cache lookup mid-run: two ranks recompiled their layers at steps 2 and 11 (32 s and 15 s
# steps, 8B FP8 on 4 H100s, TORCH_LOGS=recompiles in bench/results).
MIN_LAUNCH_SEQLEN = 512


@functools.cache  # looked up by every forward/backward call; a failed import is not cached
def _interface():
    return importlib.import_module("flash_attn.cute.interface")


def unavailable(device: torch.device) -> str | None:
    """None when FA4 can run on `device`, else why not (one line)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"FlashAttention-4 runs only on CUDA GPUs (device is {device})"
    capability = torch.cuda.get_device_capability(device)
    if not MIN_CAPABILITY <= capability <= MAX_CAPABILITY:
        return f"FlashAttention-4 needs Hopper or Blackwell (compute capability 9.x-12.x; device has {capability[0]}.{capability[1]})"
    try:
        interface = _interface()
    except ImportError as error:
        return f"flash-attn-4 is not installed or does not import ({error}; pip install 'sft-launch[flash4]')"
    for name, needed in (("_flash_attn_fwd", FWD_ARGS), ("_flash_attn_bwd", BWD_ARGS)):
        function = getattr(interface, name, None)
        if function is None or not needed <= set(inspect.signature(function).parameters):
            return f"this flash-attn-4 version has no compatible flash_attn.cute.interface.{name}"
    return None


HOPPER_NO_WINDOW = "local not supported yet on 9.x"  # the assert of flash-attn-4 versions without it


def window_unavailable(device: torch.device) -> str | None:
    """None when this flash-attn-4 computes sliding windows forward and backward on `device`. Its versions
    differ on Hopper: some assert in `_flash_attn_bwd` that sm90 has no local (windowed) backward, later ones
    pass `is_local` to the sm90 backward kernel; read from the installed function, never found mid-run."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        return None
    try:
        source = inspect.getsource(_interface()._flash_attn_bwd)
    except (OSError, TypeError):
        return None
    if HOPPER_NO_WINDOW in source:
        return ("this flash-attn-4's backward has no sliding window on Hopper (sm90); "
                "use a newer flash-attn-4, or varlen")
    return None


@torch.library.custom_op("sft::fa4_varlen_fwd", mutates_args=(), device_types="cuda")
def fa4_varlen_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
    max_q: int, max_k: int, scale: float, window: int = -1, sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k/v [T, H_kv, D] (GQA native) → out [T, H, D], lse [H, T] (fp32). `window` > 0: a
    query sees itself and window - 1 keys before it; `sinks` [H]: attention sinks (see with_sinks)."""
    out, lse, *_ = _interface()._flash_attn_fwd(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=launch_seqlen(max_q),
        max_seqlen_k=launch_seqlen(max_k), softmax_scale=scale, causal=True, return_lse=True, **_window(window),
    )
    return (out, lse) if sinks is None else with_sinks(out, lse, sinks)


@fa4_varlen_fwd.register_fake
def _fa4_varlen_fwd_fake(q, k, v, cu_q, cu_k, max_q, max_k, scale, window=-1, sinks=None):
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    return out, q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("sft::fa4_varlen_bwd", mutates_args=(), device_types="cuda")
def fa4_varlen_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int, scale: float,
    deterministic: bool, window: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv, *_ = _interface()._flash_attn_bwd(
        q, k, v, out, dout.contiguous(), lse, scale, True,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=launch_seqlen(max_q), max_seqlen_k=launch_seqlen(max_k),
        deterministic=deterministic, **_window(window),
    )
    return dq, dk, dv


@fa4_varlen_bwd.register_fake
def _fa4_varlen_bwd_fake(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, deterministic, window=-1):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _window(window: int) -> dict[str, int]:
    """FA4's causal sliding window: left window - 1, right 0 (transformers' convention, contract/attention.py)."""
    return {"window_size_left": window - 1, "window_size_right": 0} if window > 0 else {}


def with_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention sinks from a sink-free kernel's output: a sink adds exp(sink) to each softmax denominator
    and nothing to the numerator, so lse' = logaddexp(lse, sink) and out' = out * exp(lse - lse'). FA4's
    own `learnable_sink` has no gradient in its backward; this correction needs none from the kernel."""
    with_sink = torch.logaddexp(lse, sinks.float()[:, None])  # [H, T]
    factor = torch.exp(lse - with_sink).transpose(0, 1).unsqueeze(-1)  # [T, H, 1]
    return (out.float() * factor).to(out.dtype), with_sink


def sink_grad(out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """d loss / d sinks [H] from the sink-corrected `out` and `lse`: the sink's probability times minus
    the row's (dout . out), summed over the tokens (softmax's gradient, the sink's value being zero)."""
    row = (out.float() * dout.float()).sum(-1).transpose(0, 1)  # [H, T]
    return -(torch.exp(sinks.float()[:, None] - lse) * row).sum(-1).to(sinks.dtype)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_q, cu_k, max_q, max_k, scale, window, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, sinks)
    ctx.max_q, ctx.max_k, ctx.scale, ctx.window = max_q, max_k, scale, window


def _backward(ctx, dout, dlse):
    # The default backward accumulates dq with atomics (run-to-run differences in the last bits);
    # train.deterministic (torch.use_deterministic_algorithms) asks for FA4's deterministic order.
    # With sinks, `out` and `lse` are the corrected ones: the kernel's P = exp(s - lse') and its
    # rowsum(dout * out') are then those of the softmax with the sink, so dq, dk, dv are exact.
    q, k, v, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    deterministic = torch.are_deterministic_algorithms_enabled()
    dq, dk, dv = fa4_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, ctx.max_q, ctx.max_k, ctx.scale, deterministic,
                                ctx.window)
    dsinks = sink_grad(out, dout, lse, sinks) if sinks is not None and ctx.needs_input_grad[9] else None
    return dq, dk, dv, None, None, None, None, None, None, dsinks


fa4_varlen_fwd.register_autograd(_backward, setup_context=_setup_context)


def fa4_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
    max_q: int, max_k: int, scale: float | None, window: int | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention over packed documents; [T, H, D] in and out; the layer's sliding window
    (None: none) and attention sinks ([H] or None), as transformers' eager computes them."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    out, _ = fa4_varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, scale, window or -1, sinks)
    return out


def launch_seqlen(max_length: int) -> int:
    """The max sequence length FA4 is launched with: the real one, floored at MIN_LAUNCH_SEQLEN (only
    inside the ops, never on a traced length)."""
    return max(int(max_length), MIN_LAUNCH_SEQLEN)
