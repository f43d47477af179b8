"""Attention backends: one registry, registered through transformers' AttentionInterface.

transformers calls an attention function as `fn(module, query, key, value, attention_mask,
dropout=, scaling=, **kwargs)` with query [B, H, T, D], key/value [B, H_kv, T, D] (GQA: fewer KV
heads), and every model-forward kwarg in **kwargs — our packed batches put `position_ids`,
`cu_seq_lens_q/k` and `max_length_q/k` there. It expects ([B, T, H, D], weights-or-None) back.
Names registered here are unknown to transformers' mask interface, so the model builds no mask for
them (attention_mask is None): document boundaries come only from cu_seq_lens / position_ids.

Backends (user-facing name → what runs):
  fa4         flash_attn.cute varlen (the `flash-attn-4` package; Hopper/Blackwell), train/kernels/fa4.py
  flash_attn  flash_attn.flash_attn_varlen_func (the `flash-attn` FA2 package, compute capability >= 8.0)
  varlen      torch.nn.attention.varlen.varlen_attn (torch's FA2 kernel, CUDA only)
  sdpa        packed: torch sdpa with a block-diagonal causal mask (CPU path, any device);
              padded: transformers' own "sdpa"
  eager       padded only (transformers' "eager"); refuses packed batches
"auto" picks the fastest that can run, fa4 → flash_attn → varlen → sdpa, for packed batches (on one
H200, FA4's varlen fwd+bwd ran 1.8x torch's FA2 kernel) and sdpa for padded ones.

Architecture features: transformers passes each layer's `sliding_window` (None on full-attention layers)
and gpt-oss its per-head sinks (`s_aux`) as kwargs; every packed path computes them as transformers'
eager does (window: key j visible to query i iff i - j < window; FlashAttention's window_size
(window - 1, 0)). Which backend computes which feature is contract/attention.py's rule: setup_attention
skips (auto) or refuses (named) one that cannot; padded batches of a model with sinks run eager
(transformers' sdpa has none).

Registered names must not contain "flash", "sdpa" or "flex": transformers 5 reads those substrings as
requests for its own implementations (a name with "flash" is looked up as a hub kernel and the model
build fails), so ours are "sft_fa4_varlen", "sft_fa2_varlen", "sft_torch_varlen", "sft_blockdiag".
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from contract import gpus
from contract.attention import AttentionFeatures, feature_blocker
from contract.schema import ConfigError

logger = logging.getLogger(__name__)

FA4 = "sft_fa4_varlen"
FLASH_ATTN = "sft_fa2_varlen"
TORCH_VARLEN = "sft_torch_varlen"
PACKED_SDPA = "sft_blockdiag"
KEY = "model.attn_implementation"
VALID = "auto, fa4, flash_attn, varlen, sdpa, eager"


def document_ids(kwargs: dict[str, Any], batch: int, length: int, device: torch.device) -> torch.Tensor:
    """[B, T] index of the document each token belongs to (all 0 when nothing says it is packed)."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        if batch != 1:
            raise ValueError(f"packed batches have batch size 1, got {batch} rows with cu_seq_lens_q")
        positions = torch.arange(length, device=device)
        return torch.bucketize(positions, cu_seq_lens.to(device)[1:], right=True).unsqueeze(0)
    position_ids = kwargs.get("position_ids")
    if position_ids is not None:
        # A new document starts wherever the position does not continue by +1 (positions restart at 0).
        position_ids = position_ids.to(device).expand(batch, -1)
        first = position_ids[:, :1] - 1
        return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    return torch.zeros((batch, length), dtype=torch.long, device=device)


def block_causal_mask(doc_ids: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """[B, 1, T, T] bool: query t may attend key s iff s <= t, both are in the same document and, with a
    sliding `window`, t - s < window (transformers' masking_utils: kv_idx > q_idx - sliding_window)."""
    length = doc_ids.shape[-1]
    causal = torch.ones((length, length), dtype=torch.bool, device=doc_ids.device).tril()
    if window is not None:  # within one document the packed index distance is the position distance
        causal = causal.triu(-(window - 1))
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same_doc & causal).unsqueeze(1)


def packed_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Block-diagonal causal attention, with the layer's sliding window and attention sinks when the
    model passes them (Gemma 3, gpt-oss, Mistral), as transformers' eager computes them."""
    batch, heads, length, _ = query.shape
    mask = block_causal_mask(document_ids(kwargs, batch, length, query.device), sliding_window)
    if s_aux is not None:
        out = attention_with_sinks(query, key, value, mask, s_aux, scaling, dropout)
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=key.shape[1] != heads
        )
    return out.transpose(1, 2).contiguous(), None


def attention_with_sinks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                         sinks: torch.Tensor, scaling: float | None, dropout: float) -> torch.Tensor:
    """sdpa with attention sinks (gpt-oss): one extra key per head that every query sees, whose score is the
    head's sink and whose value is zero. Its score comes from one extra q/k dimension: q gets a 1, the real
    keys a 0, the sink key sink / scale. [B, H, T, D] in and out; the sinks' gradient flows through that key."""
    batch, heads, length, dim = query.shape
    scale = dim**-0.5 if scaling is None else scaling
    if key.shape[1] != heads:  # the sink key is per query head
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    query = torch.cat([query, query.new_ones(batch, heads, length, 1)], dim=-1)
    sink_key = torch.cat([key.new_zeros(batch, heads, 1, dim),
                          (sinks.to(key.dtype) / scale).reshape(1, heads, 1, 1).expand(batch, -1, -1, -1)], dim=-1)
    key = torch.cat([torch.cat([key, key.new_zeros(batch, heads, length, 1)], dim=-1), sink_key], dim=2)
    value = torch.cat([value, value.new_zeros(batch, heads, 1, dim)], dim=2)
    mask = torch.cat([mask, mask.new_ones(*mask.shape[:-1], 1)], dim=-1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale)


def _varlen_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]):
    """Packed [1, H, T, D] tensors → [T, H, D] plus cu_seq_lens (int32, on the device) and max lengths."""
    if kwargs.get("cu_seq_lens_q") is None or query.shape[0] != 1:
        raise ValueError("varlen attention needs packed batches (batch size 1 with cu_seq_lens_q; use collate_packed)")
    dtype = _half_dtype(query)
    q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))
    cu_q = kwargs["cu_seq_lens_q"].to(query.device, torch.int32)
    cu_k = kwargs.get("cu_seq_lens_k", kwargs["cu_seq_lens_q"]).to(query.device, torch.int32)
    max_q = int(kwargs.get("max_length_q") or (cu_q[1:] - cu_q[:-1]).max())
    max_k = int(kwargs.get("max_length_k") or max_q)
    return q, k, v, cu_q, cu_k, max_q, max_k


def _half_dtype(query: torch.Tensor) -> torch.dtype:
    """The FlashAttention kernels take only fp16/bf16. Under autocast (fp32 weights, bf16 compute)
    RoPE's multiply by fp32 cos/sin promotes q and k back to fp32; sdpa is autocast-aware, these
    kernels are not, so cast to the autocast dtype here."""
    if query.dtype in (torch.float16, torch.bfloat16):
        return query.dtype
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    raise ValueError("FlashAttention kernels need bf16/fp16 activations: set model.precision = \"bf16\"")


def window_size(window: int | None) -> tuple[int, int]:
    """FlashAttention's (left, right) for causal attention with transformers' sliding `window` (a query
    sees itself and window - 1 keys before it); (-1, 0) = causal, no window."""
    return (-1, 0) if window is None else (window - 1, 0)


def torch_varlen_options(parameters: set[str], scaling: float | None, head_dim: int, gqa: bool,
                         window: int | None = None) -> dict[str, Any]:
    """Keyword arguments for this torch's varlen_attn. torch 2.10 takes `is_causal` (no scale, no
    GQA); 2.11 replaced it with `window_size` (-1, 0) = causal and added `scale`; later versions add
    `enable_gqa`. Raises when the installed signature cannot express what the model needs."""
    options: dict[str, Any] = {}
    if "window_size" in parameters:
        options["window_size"] = window_size(window)
    elif window is not None:
        raise ValueError("torch varlen_attn has no window_size (torch < 2.11): cannot compute the sliding window")
    elif "is_causal" in parameters:
        options["is_causal"] = True
    else:
        raise ValueError("torch varlen_attn takes neither window_size nor is_causal: unknown signature")
    if "scale" in parameters:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - head_dim**-0.5) > 1e-12:
        raise ValueError(f"torch varlen_attn has no `scale` argument and the model needs {scaling}")
    if gqa and "enable_gqa" in parameters:
        options["enable_gqa"] = True
    return options


def transformers_attention(kernel: Callable[..., torch.Tensor]) -> Callable[..., tuple[torch.Tensor, None]]:
    """transformers' attention-function shape around a varlen kernel that takes packed [T, H, D]
    tensors: kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, dropout, window, sinks) -> [T, H, D],
    with the layer's `sliding_window` (None: full causal) and attention sinks (`s_aux`, [H] or None)."""

    def forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                sliding_window: int | None = None, s_aux: torch.Tensor | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        q, k, v, cu_q, cu_k, max_q, max_k = _varlen_inputs(query, key, value, kwargs)
        out = kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, dropout, sliding_window, s_aux)
        return out.unsqueeze(0), None

    return forward


@functools.cache  # the signature never changes in a run; read once, not at every layer's forward
def _varlen_parameters() -> frozenset[str]:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _no_sinks(sinks: torch.Tensor | None, what: str) -> None:
    """setup_attention refuses these backends for a model with sinks; this guards a direct call."""
    if sinks is not None:
        raise ValueError(f"{what} cannot compute attention sinks (contract/attention.py); use fa4 or sdpa")


def torch_varlen_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling: float | None, dropout: float,
                        window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    if dropout:
        raise ValueError("torch varlen_attn has no attention dropout; set attention_dropout = 0")
    _no_sinks(sinks, "torch varlen_attn")
    parameters = set(_varlen_parameters())
    gqa = k.shape[1] != q.shape[1]
    options = torch_varlen_options(parameters, scaling, q.shape[-1], gqa, window)
    if gqa and "enable_gqa" not in options:  # older torch: expand KV heads to the query heads
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **options)


def fa4_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling: float | None, dropout: float,
               window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    from train.kernels.fa4 import fa4_varlen_attention

    if dropout:
        raise ValueError("FlashAttention-4 has no attention dropout; set attention_dropout = 0")
    return fa4_varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, scaling, window, sinks)  # GQA native


def flash_attn_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling: float | None, dropout: float,
                      window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    _no_sinks(sinks, "flash_attn (FA2)")
    # FA2 handles GQA natively (fewer KV heads than query heads).
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=dropout, softmax_scale=scaling,
                                  causal=True, window_size=window_size(window))


def _cuda_ampere_reason(device: torch.device, what: str) -> str | None:
    """FlashAttention-2 kernels (the flash_attn package, torch's varlen): CUDA, Ampere or newer."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"{what} runs only on CUDA GPUs (device is {device})"
    major, minor = torch.cuda.get_device_capability(device)
    low = gpus.ATTENTION_MIN_CAPABILITY["flash_attn"]
    if (major, minor) < low:
        return f"{what} needs compute capability >= {low[0]}.{low[1]} (device has {major}.{minor})"
    return None


def flash_attn_unavailable(device: torch.device) -> str | None:
    """None when the flash_attn (FA2) backend can run on `device`, else the reason it cannot. The
    flash-attn-4 package also installs a `flash_attn` folder (only `flash_attn.cute`), so look for
    FA2's own interface module, not the package name."""
    try:
        found = importlib.util.find_spec("flash_attn.flash_attn_interface") is not None
    except ImportError:
        found = False
    if not found:
        return "the flash-attn (FA2) package is not installed (pip install 'sft-launch[flash2]')"
    return _cuda_ampere_reason(device, "flash_attn")


def fa4_unavailable(device: torch.device) -> str | None:
    from train.kernels.fa4 import unavailable

    return unavailable(device)


def torch_varlen_unavailable(device: torch.device) -> str | None:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (needs >= 2.10)"
    return _cuda_ampere_reason(device, "torch varlen_attn (a FlashAttention kernel)")


PACKED_BACKENDS: dict[str, tuple[str, Callable[..., Any], Callable[[torch.device], str | None]]] = {
    # user name: (registered name, attention function, availability check)
    "fa4": (FA4, transformers_attention(fa4_kernel), fa4_unavailable),
    "flash_attn": (FLASH_ATTN, transformers_attention(flash_attn_kernel), flash_attn_unavailable),
    "varlen": (TORCH_VARLEN, transformers_attention(torch_varlen_kernel), torch_varlen_unavailable),
    "sdpa": (PACKED_SDPA, packed_sdpa_forward, lambda device: None),
}
AUTO_ORDER = ("fa4", "flash_attn", "varlen", "sdpa")


def register_backends() -> None:
    """Register our attention functions with transformers (idempotent)."""
    from transformers import AttentionInterface

    for name, function, _ in PACKED_BACKENDS.values():
        AttentionInterface.register(name, function)


def setup_attention(requested: str, device: torch.device | str, packed: bool,
                    features: AttentionFeatures | None = None) -> str:
    """The `attn_implementation` to give transformers for `requested` (auto, flash_attn, varlen, sdpa,
    eager); raises ConfigError naming the reason when it cannot run here, cannot honour packing, or
    cannot compute one of the model's attention `features` (contract/attention.py: windows, sinks)."""
    device = torch.device(device)
    features = features or AttentionFeatures()
    register_backends()
    if blocker := feature_blocker(requested, features):
        raise ConfigError(f"{KEY}: {blocker}", KEY)
    if not packed:
        return _padded_backend(requested, device, features)
    if requested == "auto":
        reasons = []
        for name in AUTO_ORDER:
            registered, _, unavailable = PACKED_BACKENDS[name]
            reason = feature_blocker(name, features) or unavailable(device) or _kernel_lacks(name, device, features)
            if reason is None:
                logger.info("attention: %s for packed batches (%s)", name, "; ".join(reasons) or "first choice")
                return registered
            reasons.append(f"not {name}: {reason}")
    if requested == "eager":
        raise ConfigError(
            f"{KEY}: eager cannot keep packed documents apart (no varlen or block-diagonal path); "
            "use sdpa, varlen, flash_attn or fa4, or set data.packing = false",
            KEY,
        )
    if requested not in PACKED_BACKENDS:
        raise ConfigError(f"{KEY}: unknown backend {requested!r} (valid: {VALID})", KEY)
    registered, _, unavailable = PACKED_BACKENDS[requested]
    reason = unavailable(device) or _kernel_lacks(requested, device, features)
    if reason is not None:
        raise ConfigError(f"{KEY}: {requested} cannot be used: {reason}", KEY)
    logger.info("attention: %s for packed batches (requested)", requested)
    return registered


def _kernel_lacks(name: str, device: torch.device, features: AttentionFeatures) -> str | None:
    """What the installed kernel of a backend the contract allows still lacks for the model's features."""
    if not features.windows:
        return None
    if name == "varlen" and "window_size" not in _varlen_parameters():
        return f"torch {torch.__version__}'s varlen_attn has no window_size (needs >= 2.11) for the sliding window"
    if name == "fa4":
        from train.kernels.fa4 import window_unavailable

        return window_unavailable(device)
    return None


def _padded_backend(requested: str, device: torch.device, features: AttentionFeatures) -> str:
    """Padded batches use transformers' own implementations, which honour attention_mask (and build
    the sliding-window masks); its sdpa has no attention sinks, so a model with sinks runs eager."""
    if requested in ("auto", "sdpa"):
        return "eager" if features.sinks else "sdpa"
    if requested == "eager":
        return "eager"
    if requested == "flash_attn":
        reason = flash_attn_unavailable(device)
        if reason is not None:
            raise ConfigError(f"{KEY}: flash_attn cannot be used: {reason}", KEY)
        return "flash_attention_2"
    if requested in ("varlen", "fa4"):
        raise ConfigError(f"{KEY}: {requested} needs packed batches (data.packing = true); use sdpa for padded", KEY)
    raise ConfigError(f"{KEY}: unknown backend {requested!r} (valid: {VALID})", KEY)
