"""Speed features applied to a built model: fused lm_head + loss, q/k/v from one matmul,
torch.compile per decoder layer.

Both act on one model *instance* (no class is patched) and leave parameter names untouched, so
checkpoints, FSDP wrapping and the export see the same model as without them.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from typing import Any

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import CausalLMOutputWithPast

from train.loss import IGNORE_INDEX, linear_cross_entropy_sum

logger = logging.getLogger(__name__)


def _fused_forward(self: Any, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                   num_items_in_batch: torch.Tensor | int | None = None, *, loss_backend: str = "auto",
                   **kwargs: Any) -> CausalLMOutputWithPast:
    """LlamaForCausalLM.forward without materialising the logits when labels are given.

    Runs inside the root module's forward, so under FSDP2 the root's parameters (embedding, final
    norm, lm_head) are unsharded here exactly as in the stock forward. Loss semantics match
    transformers' ForCausalLMLoss: sum over tokens / num_items_in_batch (or / label count).
    """
    kwargs.pop("logits_to_keep", None)
    hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
    if labels is None:
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))
    weight = _head_weight(self.lm_head, hidden)
    if torch.is_autocast_enabled(hidden.device.type):
        # Autocast would run the lm_head matmul in bf16/fp16; the fused kernels do not see autocast.
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    loss_sum = linear_cross_entropy_sum(hidden, weight, labels, backend=loss_backend)
    if num_items_in_batch is None:
        num_items_in_batch = (labels[..., 1:] != IGNORE_INDEX).sum().clamp(min=1)
    return CausalLMOutputWithPast(loss=loss_sum / num_items_in_batch)


def _head_weight(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """lm_head's full weight. Under FSDP2 Accelerate shards lm_head in a unit with the final norm,
    which the norm's forward unshards; when it finds no norm (a peft-wrapped model) lm_head is a unit
    alone, which only its own forward unshards: run that forward on zero tokens."""
    if hasattr(lm_head.weight, "full_tensor"):  # still a sharded DTensor
        lm_head(hidden[..., :0, :])
    return lm_head.weight


def use_fused_loss(model: torch.nn.Module, backend: str = "auto") -> None:
    """Make `model(**batch, labels=...)` compute the loss from hidden states (train/loss.py's backend)."""
    if not (hasattr(model, "model") and hasattr(model, "lm_head")):
        raise TypeError(f"fused loss needs a *ForCausalLM model with .model and .lm_head, got {type(model)}")
    model.forward = types.MethodType(functools.partial(_fused_forward, loss_backend=backend), model)


def gather_lm_head_with_root(model: torch.nn.Module) -> None:
    """ZeRO-3: the fused loss reads lm_head.weight outside lm_head's own forward, where DeepSpeed would
    leave it partitioned (an empty tensor). Registering it as an external parameter of the root
    module makes DeepSpeed gather it for the root's forward and backward, which enclose the loss."""
    from deepspeed.runtime.zero import register_external_parameter

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    register_external_parameter(model, base.lm_head.weight)


def _fused_qkv_attention_forward(self: Any, hidden_states: torch.Tensor, position_embeddings: tuple,
                                 attention_mask: torch.Tensor | None = None, **kwargs: Any) -> tuple:
    """LlamaAttention.forward for training, with q, k and v from one matmul against the stacked
    weights: one GEMM of N = q + 2 kv features instead of three (the k/v GEMMs, N = 512 on the 1B
    shape, run ~20% under cuBLAS's rate), and the input gradient in one GEMM instead of three plus
    two adds. Everything after the projections is the stock forward, with the model's own helpers."""
    for name in ("past_key_values", "past_key_value", "cache"):
        if kwargs.pop(name, None) is not None:
            raise RuntimeError("fused q/k/v projections are a training path; they take no KV cache")
    kwargs.pop("cache_position", None)
    modeling = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    projections = (self.q_proj, self.k_proj, self.v_proj)
    qkv = F.linear(hidden_states, torch.cat([p.weight for p in projections]))
    q, k, v = (t.view(*input_shape, -1, self.head_dim).transpose(1, 2)
               for t in qkv.split([p.out_features for p in projections], dim=-1))
    q, k = modeling.apply_rotary_pos_emb(q, k, *position_embeddings)
    implementation = self.config._attn_implementation
    attention = (modeling.eager_attention_forward if implementation == "eager"
                 else modeling.ALL_ATTENTION_FUNCTIONS[implementation])
    out, weights = attention(self, q, k, v, attention_mask, dropout=self.attention_dropout if self.training else 0.0,
                             scaling=self.scaling, **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def qkv_fusable(attention: torch.nn.Module) -> bool:
    """Transformers' own LlamaAttention with plain bias-free q/k/v Linears (not LoRA-wrapped)."""
    projections = [getattr(attention, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    return (type(attention).__name__ == "LlamaAttention" and type(attention).__module__.startswith("transformers.")
            and all(type(p) is torch.nn.Linear and p.bias is None for p in projections))


def fuse_qkv_projections(layers: list[torch.nn.Module]) -> int:
    """Route each fusable decoder layer's attention through _fused_qkv_attention_forward (instance
    methods, parameter names unchanged). The forward reads the weights outside their modules' own
    forward, so LoRA (adapters would be skipped) and ZeRO-3 (weights gathered per module) keep the
    stock path; the caller decides."""
    fused = [layer.self_attn for layer in layers if qkv_fusable(layer.self_attn)]
    for attention in fused:
        attention.forward = types.MethodType(_fused_qkv_attention_forward, attention)
    return len(fused)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """torch.compile each decoder layer's forward (the repeated block; hooks and checkpointing stay
    outside the compiled region, which keeps FSDP's per-layer hooks and recompute intact)."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    logger.info("torch.compile: %d decoder layers", len(layers))
    return len(layers)


def compiled_graphs() -> int:
    """Graphs torch.compile has captured in this process so far. It stays flat after the first step
    when every pack shape reuses the first graph; a rise mid-run is a recompilation, which every
    rank waits for (seconds for a large layer)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileWatch:
    """Warns when graphs were compiled since the last logged window (the first window's are expected)."""

    def __init__(self) -> None:
        self.seen: int | None = None

    def check(self, step: int) -> int:
        graphs = compiled_graphs()
        if self.seen is not None and graphs > self.seen:
            logger.warning("torch.compile captured %d new graph(s) before step %d: every rank waited for the "
                           "compilation (TORCH_LOGS=recompiles names the guard that failed)", graphs - self.seen, step)
        self.seen = graphs
        return graphs
