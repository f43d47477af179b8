"""The router as the model defines it: its load-balancing loss, fp32 routing, and the experts' load.

transformers adds ``router_aux_loss_coef * load_balancing_loss_func(router_logits, ...)`` to the loss only
when the forward is asked for ``output_router_logits``, and our fused lm_head + loss forward
(train/kernels/perf.py) never was: MoE runs trained without it. ``RouterLoss.install`` wraps the causal
LM's forward (fused or stock) so every training forward returns the router logits, adds the family's own
``load_balancing_loss_func`` (from the model's modeling module, with the batch's attention mask) weighted by
the coefficient (the config's, or ``train.router_aux_loss_coef``; 0 = off) and divided by the micro-batches
per step (the token loss is a per-step mean; the stock forward's own addition is switched off so it is
counted once), and counts each layer's top-k assignments per expert on the device (no host sync) for
metrics.jsonl: ``expert_load_min`` / ``expert_load_max``, per layer, each expert's share of the layer's
assignments over the logging window (1/E each when perfectly balanced).

fp32 routing: the router's logits, softmax and top-k run in fp32 whatever the weights' storage or autocast
(``ROUTERS`` holds transformers' router forward per family, in fp32); families not listed keep theirs.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

logger = logging.getLogger(__name__)


def softmax_topk_router(self: torch.nn.Module, hidden_states: torch.Tensor):
    """Qwen3MoeTopKRouter.forward in fp32: softmax over experts, top-k, optionally renormalized."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    with torch.autocast(hidden_states.device.type, enabled=False):
        router_logits = F.linear(hidden_states.float(), self.weight.float())
        router_probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value = router_top_value / router_top_value.sum(dim=-1, keepdim=True)
    return router_logits, router_top_value, router_indices


def topk_softmax_router(self: torch.nn.Module, hidden_states: torch.Tensor):
    """GptOssTopKRouter.forward in fp32: top-k of the logits (with bias), softmax over those k."""
    with torch.autocast(hidden_states.device.type, enabled=False):
        router_logits = F.linear(hidden_states.float(), self.weight.float(), self.bias.float())
        router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)
        router_scores = torch.softmax(router_top_value, dim=1, dtype=torch.float)
    return router_logits, router_scores, router_indices


# model_type: (router attribute of the sparse MoE block, its forward in fp32)
ROUTERS: dict[str, tuple[str, Callable]] = {
    "qwen3_moe": ("gate", softmax_topk_router),
    "gpt_oss": ("router", topk_softmax_router),
}


def is_moe(model: torch.nn.Module) -> bool:
    return hasattr(model, "router_aux_loss_coef") and hasattr(model, "num_experts_per_tok")


def routers_in_fp32(model: torch.nn.Module) -> int:
    """Route every layer in fp32 (ROUTERS); the number of routers so changed (0: family not listed)."""
    attribute, forward = ROUTERS.get(model.config.model_type, (None, None))
    if attribute is None:
        return 0
    count = 0
    for layer in model.model.layers:
        router = getattr(layer.mlp, attribute, None)
        if router is not None and hasattr(router, "top_k"):  # a dense layer (mlp_only_layers) has none
            router.forward = types.MethodType(forward, router)
            count += 1
    return count


class RouterLoss:
    """The load-balancing loss added to each training forward, and the experts' load it saw."""

    def __init__(self, model: torch.nn.Module, coef: float, micro_batches: int) -> None:
        self.coef, self.scale = coef, coef / micro_batches
        self.num_experts, self.top_k = int(model.num_experts), int(model.num_experts_per_tok)
        self.balance_loss = sys.modules[type(model).__module__].load_balancing_loss_func
        self.counts: torch.Tensor | None = None  # [layers, experts] top-k assignments since the last drain
        self.aux_sum: torch.Tensor | None = None
        self.forwards = 0

    @classmethod
    def install(cls, model: torch.nn.Module, override: float | None, micro_batches: int) -> RouterLoss | None:
        """Wrap `model.forward` (a *ForCausalLM of an MoE family); None for a dense model."""
        if not is_moe(model):
            return None
        coef = float(model.config.router_aux_loss_coef if override is None else override)
        book = cls(model, coef, micro_batches)
        model.router_aux_loss_coef = 0.0  # the stock forward must not add it a second time
        model.sft_router_loss = book  # a plain attribute (not a module): router_loss_of finds it
        model.forward = types.MethodType(functools.partial(_forward_with_router_loss, inner=model.forward, book=book),
                                         model)
        logger.info("router load-balancing loss: coefficient %g (%s)%s; routers in fp32: %d layers", coef,
                    "train.router_aux_loss_coef" if override is not None else "the model config's",
                    ", off" if coef == 0 else "", routers_in_fp32(model))
        return book

    def observe(self, router_logits: tuple[torch.Tensor, ...], attention_mask: torch.Tensor | None) -> torch.Tensor:
        """The aux loss of one forward (the family's function); adds the forward's expert counts to the books."""
        aux = self.balance_loss(router_logits, self.num_experts, self.top_k, attention_mask)
        with torch.no_grad():
            picks = torch.stack([torch.topk(logits, self.top_k, dim=-1).indices.reshape(-1)
                                 for logits in router_logits])  # [layers, tokens * k]
            counts = torch.zeros(picks.shape[0], self.num_experts, device=picks.device)
            counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=counts.dtype))
            self.counts = counts if self.counts is None else self.counts + counts
            aux_detached = aux.detach().float()
            self.aux_sum = aux_detached if self.aux_sum is None else self.aux_sum + aux_detached
            self.forwards += 1
        return aux

    def drain(self) -> dict[str, Any]:
        """The metrics of the forwards since the last call (one host sync), and reset."""
        if self.counts is None:
            return {}
        shares = (self.counts / self.counts.sum(dim=1, keepdim=True).clamp(min=1)).cpu()
        record = {"aux_loss": round(float(self.aux_sum) / self.forwards, 6),
                  "expert_load_min": [round(float(v), 4) for v in shares.min(dim=1).values],
                  "expert_load_max": [round(float(v), 4) for v in shares.max(dim=1).values]}
        self.counts, self.aux_sum, self.forwards = None, None, 0
        return record


def router_loss_of(model: torch.nn.Module) -> RouterLoss | None:
    """The RouterLoss installed on an (unwrapped, possibly PEFT-wrapped) model, None for a dense one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "sft_router_loss", None)


def _forward_with_router_loss(self: torch.nn.Module, *args: Any, inner: Callable, book: RouterLoss,
                              **kwargs: Any) -> Any:
    if not self.training:
        return inner(*args, **kwargs)
    kwargs["output_router_logits"] = True
    out = inner(*args, **kwargs)
    router_logits = getattr(out, "router_logits", None)
    if not router_logits:
        return out
    mask = kwargs.get("attention_mask")
    aux = book.observe(tuple(router_logits), mask if mask is not None and mask.dim() == 2 else None)
    loss = out.loss
    if loss is not None and book.scale > 0:
        loss = loss + book.scale * aux.to(loss.device)
    return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux, logits=getattr(out, "logits", None))
