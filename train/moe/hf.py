"""Our grouped experts inside transformers' models: registered as the experts implementation "sft_grouped".

transformers 5 decorates each family's experts class with ``use_experts_implementation``: its forward
dispatches on ``config._experts_implementation`` through ``ExpertsInterface`` (integrations/moe.py), the way
attention dispatches through ``AttentionInterface`` (train/kernels/attention.py registers ours there). So the
model, its parameters, checkpoints and export stay transformers' own; only the experts' compute changes.
The module's own flags say how its weights are stored (``is_transposed``, ``has_bias``) and its own
``_apply_gate`` gates them (Qwen3-MoE's silu halves, gpt-oss's clamped interleaved SwiGLU), so every
family transformers decorates is computed as it defines it.

LoRA on the experts: PEFT's ``target_parameters`` stores per-expert adapters for a 3D expert parameter
(``lora_A`` [E·r, in], ``lora_B`` [out, E·r]) and saves, loads and merges them, but its forward folds
``W + B·A`` for every expert into a full-size weight on every call (a [E, out, in] tensor and its gradient).
Here the wrappers' forward goes straight to the experts module and the adapters ride the grouped GEMMs at
rank r (train/moe/experts.py ``lora_delta``): PEFT's storage, our compute. ``expert_adapters`` reads them.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward

from train.moe.experts import ExpertAdapters, ExpertLayout, ExpertLora, routed_experts

logger = logging.getLogger(__name__)

EXPERTS_IMPLEMENTATION = "sft_grouped"
ADAPTER = "default"  # PEFT's adapter name (train/engine/model.py apply_lora makes one)
LORA_WRAPPERS = "sft_lora_wrappers"  # experts module attribute: {parameter name: PEFT ParamWrapper}


def expert_adapters(experts: torch.nn.Module) -> ExpertAdapters | None:
    """The active per-expert LoRA adapters of this experts module, None without any."""
    wrappers: dict[str, Any] = experts.__dict__.get(LORA_WRAPPERS) or {}
    found = {}
    for name, wrapper in wrappers.items():
        if wrapper.disable_adapters or wrapper.merged or ADAPTER not in wrapper.lora_A \
                or ADAPTER not in wrapper.active_adapters:
            continue
        a = wrapper.lora_A[ADAPTER].weight  # [E·r, in], expert-major
        b = wrapper.lora_B[ADAPTER].weight  # [out, E·r], rank-major (PEFT's get_delta_factors)
        num = wrapper.num_experts
        found[name] = ExpertLora(a.reshape(num, -1, a.shape[-1]), b.reshape(b.shape[0], -1, num).permute(2, 0, 1),
                                 wrapper.scaling[ADAPTER])
    if not found:
        return None
    return ExpertAdapters(gate_up=found.get("gate_up_proj"), down=found.get("down_proj"))


def sft_grouped_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts forward signature; one grouped GEMM per projection (train/moe/experts.py)."""
    if not self.has_gate or self.has_post_expert_norm or self._is_expert_parallel:
        if expert_adapters(self) is not None:  # never drop the adapters silently
            raise NotImplementedError(f"LoRA on {type(self).__name__}'s experts: no gate, a post-expert norm or "
                                      "transformers' expert parallelism is not supported by sft_grouped")
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)  # theirs, unchanged
    layout = ExpertLayout(type(self).__name__, transposed=self.is_transposed, gate=self._apply_gate)
    bias = self.has_bias
    return routed_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj,
                          expert_adapters(self), layout=layout,
                          gate_up_bias=self.gate_up_proj_bias if bias else None,
                          down_bias=self.down_proj_bias if bias else None)


def register() -> None:
    ExpertsInterface.register(EXPERTS_IMPLEMENTATION, sft_grouped_experts_forward)


def experts_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules transformers dispatches through ExpertsInterface (its decorator gives them these flags)."""
    return [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "_is_expert_parallel")]


def use_grouped_experts(model: torch.nn.Module) -> int:
    """Route every experts module of `model` through "sft_grouped"; how many there are (0: not an MoE)."""
    found = experts_modules(model)
    if found:
        register()
        model.set_experts_implementation(EXPERTS_IMPLEMENTATION)
    return len(found)


def _straight_to_base(self: torch.nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self.base_layer(x, *args, **kwargs)


def adapt_experts_in_place(peft_model: torch.nn.Module) -> int:
    """After get_peft_model: each ParamWrapper on an expert parameter hands its adapter to the experts module
    (read by expert_adapters) and forwards without PEFT's full-size fold. Returns how many parameters."""
    from peft.tuners.lora.layer import ParamWrapper

    count = 0
    for wrapper in peft_model.modules():
        if not isinstance(wrapper, ParamWrapper):
            continue
        experts = wrapper.get_base_layer()
        if wrapper.num_experts < 2 or not _dispatches_to_us(experts):
            continue  # a 2D parameter (the router), or experts computed elsewhere: PEFT's own fold stays
        experts.__dict__.setdefault(LORA_WRAPPERS, {})[wrapper.parameter_name] = wrapper  # plain dict: no submodule
        wrapper.forward = types.MethodType(_straight_to_base, wrapper)
        count += 1
    return count


def _dispatches_to_us(experts: torch.nn.Module) -> bool:
    config = getattr(experts, "config", None)
    return hasattr(experts, "_is_expert_parallel") and \
        getattr(config, "_experts_implementation", None) == EXPERTS_IMPLEMENTATION

