"""contract/shape.py against the model transformers builds: for every preset and a tiny config of every family,
the planner's parameter count equals the model built on the meta device (no memory, no weights), exactly;
the LoRA counts equal the adapters' shapes; MoE active parameters and MFU's N count the top-k experts.

The presets are built at full size (Qwen3-235B-A22B included): on the meta device a parameter is a shape.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from contract.schema import ConfigError
from contract.shape import EXPERT_LORA_TARGETS, LORA_TARGETS, ModelShape
from launcher.resolve.presets import PRESETS

SMALL = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             vocab_size=128, head_dim=32)
NO_HEAD_DIM = {k: v for k, v in SMALL.items() if k != "head_dim"}
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48)
TINY: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **SMALL},
    "llama-biases": {"model_type": "llama", **SMALL, "attention_bias": True, "mlp_bias": True},
    "mistral": {"model_type": "mistral", **SMALL, "sliding_window": 16},
    "qwen2": {"model_type": "qwen2", **NO_HEAD_DIM},
    "qwen3": {"model_type": "qwen3", **SMALL},
    "qwen3-tied": {"model_type": "qwen3", **SMALL, "tie_word_embeddings": True},
    "qwen3-moe": {"model_type": "qwen3_moe", **SMALL, **MOE},
    "qwen3-moe-dense-layers": {"model_type": "qwen3_moe", **SMALL, **MOE, "mlp_only_layers": [0], "decoder_sparse_step": 1},
    "qwen2-moe-shared": {"model_type": "qwen2_moe", **NO_HEAD_DIM, **MOE, "shared_expert_intermediate_size": 80},
    "gpt-oss": {"model_type": "gpt_oss", **SMALL, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 16},
    "gemma3": {"model_type": "gemma3_text", **SMALL, "sliding_window": 16},
}


def meta_model(arch: dict[str, Any]) -> torch.nn.Module:
    """transformers' own class for the config, built without memory."""
    config = AutoConfig.for_model(**arch)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # a tied lm_head is the embedding's parameter: once


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count_equals_the_model_transformers_builds(name: str) -> None:
    preset = PRESETS[name]
    model = meta_model({"model_type": "llama", **preset.arch})
    assert preset.num_params == parameter_count(model), name
    assert type(model).__name__.replace("ForCausalLM", "DecoderLayer") == preset.layer_class


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_config_parameter_count_equals_the_model(name: str) -> None:
    arch = TINY[name]
    model = meta_model(arch)
    assert ModelShape.from_arch(arch).total_params == parameter_count(model)
    # The GPU side reads model.config.to_dict() (train/engine/loop.py): every default filled in, same count.
    assert ModelShape.from_arch(model.config.to_dict()).total_params == parameter_count(model)


@pytest.mark.parametrize("name", list(TINY))
def test_windows_follow_the_layer_types_transformers_resolves(name: str) -> None:
    config = meta_model(TINY[name]).config
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "mistral":  # no layer_types: the window applies to every layer
        types = ["sliding_attention"] * config.num_hidden_layers
    expected = tuple(window if t == "sliding_attention" else None for t in types)
    assert ModelShape.from_arch(config.to_dict()).windows == expected


def _expert_tensors(model: torch.nn.Module) -> dict[str, list[tuple[int, ...]]]:
    """Target name -> the shapes of the weights it adapts, read off the built model."""
    found: dict[str, list[tuple[int, ...]]] = {}
    for name, param in model.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            found.setdefault("experts." + name.rsplit(".", 1)[1], []).append(tuple(param.shape))
        elif name.endswith(("mlp.gate.weight", "mlp.router.weight")):
            found.setdefault("router", []).append(tuple(param.shape))
    return found


@pytest.mark.parametrize("name", ["qwen3-moe", "qwen3-moe-dense-layers", "qwen2-moe-shared", "gpt-oss"])
def test_expert_lora_counts_r_times_in_plus_out_per_expert(name: str) -> None:
    """An expert target's adapter is per expert: A [E, r, in], B [E, out, r] -> r·(in + out)·E a layer;
    the router's is r·(in + out). Counted from the built model's tensors."""
    r, model = 4, meta_model(TINY[name])
    shape = ModelShape.from_arch(TINY[name])
    for target, shapes in _expert_tensors(model).items():
        expected = sum(r * (s[0] * (s[1] + s[2]) if len(s) == 3 else s[0] + s[1]) for s in shapes)
        assert shape.lora_params(r, [target]) == expected, target
    assert shape.lora_tensor_sizes(r, list(EXPERT_LORA_TARGETS))
    assert sum(shape.lora_tensor_sizes(r, list(EXPERT_LORA_TARGETS))) == shape.lora_params(r, list(EXPERT_LORA_TARGETS))


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "qwen2-moe-shared", "gemma3"])
def test_dense_lora_count_equals_peft(name: str) -> None:
    peft = pytest.importorskip("peft")
    model = meta_model(TINY[name])
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=list(LORA_TARGETS)))
    adapters = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    assert ModelShape.from_arch(TINY[name]).lora_params(4, list(LORA_TARGETS)) == adapters


def test_qwen3_30b_a3b_counts_every_expert_and_its_active_ones() -> None:
    """The issue's numbers: 30.5B parameters, 3.35B active (8 of 128 experts); the planner once said 2.89B."""
    shape = ModelShape.from_arch(PRESETS["qwen3-30b-a3b"].arch)
    assert round(shape.total_params / 1e9, 2) == 30.53
    assert round(shape.active_params / 1e9, 2) == 3.35
    assert shape.expert_params == 48 * 128 * 3 * 2048 * 768
    # MFU's N: attention + router + 8 experts per layer + lm_head, no embedding lookup.
    attention = 2 * 2048 * 4096 + 2 * 2048 * 512
    assert shape.matmul_params == 48 * (attention + 2048 * 128 + 8 * 3 * 2048 * 768) + 151936 * 2048
    assert shape.params_per_rank(8) * 8 >= shape.total_params
    assert shape.params_per_rank(8, ep=8) == shape.params_per_rank(8)  # resident shards: the same bytes
    assert shape.gathered_layer_params(ep=8) < shape.layer_params  # a rank gathers 16 experts, not 128


def test_sliding_windows_cap_the_attention_flops() -> None:
    """gpt-oss: half its layers attend 128 keys at most, so at 8k-token documents its attention FLOPs are
    about half of what full attention on every layer would be."""
    shape = ModelShape.from_arch(PRESETS["gpt-oss-20b"].arch)
    full = 12 * shape.q_dim * shape.layers * 8192 / 2
    assert shape.attention_flops_per_token(8192) == pytest.approx(full / 2 + 12 * shape.q_dim * 12 * (128 - 1))
    assert shape.attention_flops_per_token(64) == pytest.approx(6 * shape.layers * shape.q_dim * 64)  # all within


def test_lora_on_experts_of_a_dense_model_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="this model has none of experts.down_proj"):
        ModelShape.from_arch(TINY["llama"]).lora_params(8, ["experts.down_proj"])


def test_an_unknown_family_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match="arch.model_type: 'phi3' is not a family"):
        ModelShape.from_arch({"model_type": "phi3", **SMALL})
