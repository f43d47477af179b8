"""What each model family (config.json `model_type`) builds beyond the Llama decoder layer, and how its
config says which layers slide or hold experts: the facts contract/shape.py counts parameters and FLOPs by.
Each is transformers' modeling_<family>.py; tests/launcher/test_shape_meta.py checks them against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.schema import ConfigError


@dataclass(frozen=True)
class Family:
    """What a `model_type` builds beyond the Llama layer (transformers' modeling_<family>.py)."""

    qkv_bias: bool | None = None  # None: config `attention_bias` decides q, k, v and o together
    o_bias: bool | None = None
    qk_norm: bool = False  # q_norm and k_norm, head_dim wide
    norms_per_layer: int = 2
    sinks: bool = False  # one learned attention sink per head
    moe: bool = False
    expert_bias: bool = False  # gpt-oss: gate_up_proj_bias [E, 2I], down_proj_bias [E, d]
    router_bias: bool = False
    fp32_router: bool = False  # train/moe/router.py ROUTERS: routed in fp32 (the router saves an fp32 input copy)
    tied_default: bool = False
    attention_bias_default: bool = False
    all_sliding: bool = False  # Mistral: `sliding_window` applies to every layer
    sliding_every: int = 0  # gpt-oss 2 (sliding, full, ...); Gemma 3 6 (5 sliding, 1 full)
    layer_class: str = "LlamaDecoderLayer"  # the decoder layer FSDP wraps


FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(qkv_bias=False, o_bias=False, all_sliding=True, layer_class="MistralDecoderLayer"),
    "qwen2": Family(qkv_bias=True, o_bias=False, layer_class="Qwen2DecoderLayer"),
    "qwen2_moe": Family(qkv_bias=True, o_bias=False, moe=True, layer_class="Qwen2MoeDecoderLayer"),
    "qwen3": Family(qk_norm=True, layer_class="Qwen3DecoderLayer"),
    # Qwen3-MoE's attention takes config.sliding_window on every layer (no layer types, no max_window_layers)
    "qwen3_moe": Family(qk_norm=True, moe=True, fp32_router=True, all_sliding=True,
                        layer_class="Qwen3MoeDecoderLayer"),
    "gpt_oss": Family(sinks=True, moe=True, expert_bias=True, router_bias=True, fp32_router=True,
                      attention_bias_default=True, sliding_every=2, layer_class="GptOssDecoderLayer"),
    "gemma3_text": Family(qk_norm=True, norms_per_layer=4, tied_default=True, sliding_every=6,
                          layer_class="Gemma3DecoderLayer"),
}


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: a multimodal config's `text_config` (Gemma 3), else the config itself."""
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in config:
        return {"model_type": f"{config.get('model_type', '')}_text", **text}
    return config


def layer_windows(arch: dict[str, Any], family: Family, layers: int) -> tuple[int | None, ...]:
    """The attention window of each layer (None = full causal attention), as transformers resolves it: the one
    rule of which layers slide (the planner's FLOPs, contract/attention.py's backend check)."""
    window = arch.get("sliding_window")
    types = arch.get("layer_types")
    if not window or arch.get("use_sliding_window") is False:  # Qwen2/3 keep a window in config.json, unused
        return (None,) * layers
    if isinstance(types, list) and len(types) == layers:
        return tuple(window if t == "sliding_attention" else None for t in types)
    if family.all_sliding:
        return (window,) * layers
    every = arch.get("sliding_window_pattern") or family.sliding_every
    if every:
        return tuple(None if (i + 1) % every == 0 else window for i in range(layers))
    if arch.get("use_sliding_window"):  # Qwen2/3: the layers from max_window_layers on slide
        first = arch.get("max_window_layers", layers)
        return tuple(window if i >= first else None for i in range(layers))
    return (None,) * layers


def moe_layers(arch: dict[str, Any], layers: int, experts: int) -> tuple[bool, ...]:
    """Which layers hold routed experts: every `decoder_sparse_step`-th, less `mlp_only_layers` (Qwen-MoE)."""
    if not experts:
        return (False,) * layers
    step = int(arch.get("decoder_sparse_step") or 1)
    dense = set(arch.get("mlp_only_layers") or ())
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(layers))


def vision_tower_params(config: dict[str, Any], text_hidden: int) -> int:
    """Parameters of a multimodal checkpoint's vision tower and projector, which AutoModelForCausalLM loads with
    the language model (Gemma 3: a SigLIP encoder without its head, and the projector: a [vision, text]
    matrix and an RMSNorm); 0 without a `vision_config`. Text-only training runs none of it (no FLOPs),
    but every parameter is resident, trained and sharded like the rest."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    if vision.get("model_type", "siglip_vision_model") != "siglip_vision_model" or vision.get("vision_use_head"):
        raise ConfigError(f"vision_config: a {vision.get('model_type')!r} tower is not one the planner counts",
                          "vision_config")
    h, i, patch = vision["hidden_size"], vision["intermediate_size"], vision.get("patch_size", 14)
    embeddings = h * 3 * patch * patch + h + (vision["image_size"] // patch) ** 2 * h
    layer = 2 * 2 * h + 4 * (h * h + h) + (h * i + i) + (i * h + h)
    return embeddings + vision["num_hidden_layers"] * layer + 2 * h + h * text_hidden + h
