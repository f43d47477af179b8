"""Tiny random configs of the families users fine-tune, built with transformers' own config classes,
each with the architecture features that make it itself: Llama 3.1's llama3 RoPE scaling, Mistral's
sliding window, Qwen2.5's attention biases, Qwen3's QK-norm, Gemma 3's local/global layers, norms and
embedding scale, gpt-oss's sinks, alternating windows and experts, Qwen3-MoE's experts. Windows are
WINDOW tokens, shorter than the test documents, so they change the function."""

from __future__ import annotations

from typing import Any

WINDOW = 5
COMMON: dict[str, Any] = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
LOCAL_GLOBAL = ["sliding_attention", "full_attention"]


def _llama():
    from transformers import LlamaConfig

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return LlamaConfig(**COMMON, num_hidden_layers=2, rope_parameters=rope)


def _mistral():
    from transformers import MistralConfig

    return MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=WINDOW)


def _qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(**COMMON, num_hidden_layers=2)


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=16)


def _gemma3():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**COMMON, num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=24,
                            sliding_window=WINDOW, layer_types=LOCAL_GLOBAL)


def _gpt_oss():
    from transformers import GptOssConfig

    common = {k: v for k, v in COMMON.items() if k != "intermediate_size"}
    common["max_position_embeddings"] = 4096  # its YaRN RoPE's original context: no mismatch warning
    return GptOssConfig(**common, intermediate_size=32, num_hidden_layers=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=WINDOW, layer_types=LOCAL_GLOBAL)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**COMMON, num_hidden_layers=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, decoder_sparse_step=1)


FAMILIES = {"llama3.1": _llama, "mistral": _mistral, "qwen2.5": _qwen2, "qwen3": _qwen3, "gemma3": _gemma3,
            "gpt-oss": _gpt_oss, "qwen3-moe": _qwen3_moe}


def family_config(name: str):
    """A fresh config of family `name` (tests set `_attn_implementation` on it)."""
    return FAMILIES[name]()
