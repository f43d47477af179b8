"""Which attention backend computes which architecture feature: the one rule, read by the launcher
(before the queue, from the model's config.json) and by train/ (at model build, from the config).

Two features change the attention function beyond "causal within a document":
  sliding window  a query at position i sees key j iff i - j < window (transformers' masking_utils
                  `sliding_window_overlay`: kv_idx > q_idx - sliding_window), per layer type
                  (Gemma 3's sliding_attention layers, gpt-oss's alternating ones, Mistral's every layer)
  attention sinks a learned per-head logit in the softmax's denominator that attends to nothing
                  (gpt-oss's `sinks`, passed as `s_aux`)
A backend that cannot compute a feature is refused in one line naming the feature, the layer type and
a backend that can; nothing is silently approximated. A window no document reaches (model_max_length
<= window) changes nothing and needs no support.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contract.families import FAMILIES, layer_windows, text_config

WINDOW = "sliding window"
SINKS = "attention sinks"
# Backend (model.attn_implementation value) -> the features its kernel computes exactly.
COMPUTES: dict[str, frozenset[str]] = {
    "fa4": frozenset({WINDOW, SINKS}),  # window_size_left/right; sinks by the log-sum-exp correction
    "flash_attn": frozenset({WINDOW}),  # FA2's window_size; no sinks
    "varlen": frozenset({WINDOW}),  # torch >= 2.11's window_size; no sinks
    "sdpa": frozenset({WINDOW, SINKS}),  # packed: ours (train/kernels/attention.py); padded: transformers' masks
    "eager": frozenset({WINDOW, SINKS}),  # transformers' own reference
}


@dataclass(frozen=True)
class AttentionFeatures:
    """The features a model's attention uses: `windows` maps a layer type to its window (tokens a
    query sees, itself included); `sinks` names the layer types with attention sinks."""

    windows: dict[str, int] = field(default_factory=dict)
    sinks: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: dict[str, Any], max_length: int | None = None) -> AttentionFeatures:
        """From an HF config dict (config.json or PretrainedConfig.to_dict()); a multimodal config's
        `text_config` is the language model's. Which layers slide is contract.families' rule (the planner's too);
        windows no document of `max_length` reaches are left out."""
        config = text_config(config)
        family = FAMILIES.get(config.get("model_type", ""), FAMILIES["llama"])
        layers = int(config.get("num_hidden_layers") or len(config.get("layer_types") or ()) or 1)
        windows = layer_windows(config, family, layers)
        types = _layer_types(config, layers) or ["sliding_attention" if w else "full_attention" for w in windows]
        reached = {t: int(w) for t, w in zip(types, windows, strict=True)
                   if w and (max_length is None or max_length > int(w))}
        sinks = tuple(dict.fromkeys(types)) if family.sinks else ()
        return cls(reached, sinks)

    def needed(self) -> list[tuple[str, str]]:
        """(feature, layer types) pairs, in a fixed order."""
        out = []
        if self.windows:
            out.append((WINDOW, ", ".join(f"{t} (window {w})" for t, w in self.windows.items())))
        if self.sinks:
            out.append((SINKS, ", ".join(self.sinks)))
        return out


def _layer_types(config: dict[str, Any], layers: int) -> list[str]:
    """config's layer_types; an older Gemma 3 config.json has only sliding_window_pattern (every n-th layer
    global, transformers' Gemma3TextConfig rule); [] when it names none."""
    if isinstance(config.get("layer_types"), list) and len(config["layer_types"]) == layers:
        return list(config["layer_types"])
    pattern = config.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    return []


def feature_blocker(backend: str, features: AttentionFeatures) -> str | None:
    """None when `backend` computes every feature the model uses, else one line saying which it cannot."""
    computes = COMPUTES.get(backend)
    if computes is None:  # "auto" and unknown names are decided elsewhere
        return None
    for feature, layers in features.needed():
        if feature not in computes:
            able = ", ".join(name for name, can in COMPUTES.items() if feature in can and name != "eager")
            return f"{backend} cannot compute the model's {feature} ({layers} layers); use {able}"
    return None

