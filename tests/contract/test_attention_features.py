"""contract/attention.py: the features read from config.json files as the hub ships them, and the one-line
refusal of a backend that cannot compute one."""

from __future__ import annotations

from contract.attention import SINKS, WINDOW, AttentionFeatures, feature_blocker

MISTRAL_7B_V01 = {"model_type": "mistral", "sliding_window": 4096, "num_hidden_layers": 32}
QWEN25 = {"model_type": "qwen2", "sliding_window": 131072, "use_sliding_window": False, "max_window_layers": 28}
GEMMA3_OLD = {"model_type": "gemma3_text", "sliding_window": 512, "sliding_window_pattern": 6, "num_hidden_layers": 12}
GEMMA3_VLM = {"model_type": "gemma3", "text_config": {**GEMMA3_OLD, "sliding_window": 1024}}
GPT_OSS = {"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12}


def test_windows_and_sinks_as_each_family_ships_them():
    assert AttentionFeatures.from_config(MISTRAL_7B_V01).windows == {"sliding_attention": 4096}  # every layer
    assert AttentionFeatures.from_config(MISTRAL_7B_V01, max_length=4096).needed() == []  # no document reaches it
    assert AttentionFeatures.from_config(QWEN25).needed() == []  # use_sliding_window = false
    assert AttentionFeatures.from_config(GEMMA3_OLD).windows == {"sliding_attention": 512}
    assert AttentionFeatures.from_config(GEMMA3_VLM).windows == {"sliding_attention": 1024}
    gpt_oss = AttentionFeatures.from_config(GPT_OSS)
    assert [feature for feature, _ in gpt_oss.needed()] == [WINDOW, SINKS]
    assert gpt_oss.sinks == ("sliding_attention", "full_attention")


def test_only_a_backend_that_cannot_compute_a_feature_is_refused():
    gpt_oss = AttentionFeatures.from_config(GPT_OSS)
    assert [name for name in ("fa4", "flash_attn", "varlen", "sdpa") if not feature_blocker(name, gpt_oss)] == [
        "fa4", "sdpa"]
    assert feature_blocker("varlen", gpt_oss) == ("varlen cannot compute the model's attention sinks "
                                                  "(sliding_attention, full_attention layers); use fa4, sdpa")
    assert feature_blocker("flash_attn", AttentionFeatures.from_config(MISTRAL_7B_V01)) is None
    assert feature_blocker("auto", gpt_oss) is None  # auto picks among the able ones


def test_qwen3_moe_slides_every_layer_only_with_use_sliding_window():
    """transformers' Qwen3-MoE hands config.sliding_window to every layer, and only when use_sliding_window (its
    config.json keeps a window either way): the backend check and the planner's FLOPs read the same rule."""
    from contract.families import FAMILIES, layer_windows

    config = {"model_type": "qwen3_moe", "sliding_window": 4096, "num_hidden_layers": 4, "max_window_layers": 2}
    assert AttentionFeatures.from_config({**config, "use_sliding_window": False}).needed() == []
    assert AttentionFeatures.from_config({**config, "use_sliding_window": True}).windows == {"sliding_attention": 4096}
    assert layer_windows({**config, "use_sliding_window": True}, FAMILIES["qwen3_moe"], 4) == (4096,) * 4
