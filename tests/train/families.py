"""Tiny random configs of the families users fine-tune, built with transformers' own config classes,
each with the architecture features that make it itself: Llama 3.1's llama3 RoPE scaling, Mistral's
sliding window, Qwen2.5's attention biases, Qwen3's QK-norm, Gemma 3's local/global layers, norms and
embedding scale, gpt-oss's sinks, alternating windows and experts, Qwen3-MoE's experts. Windows are
WINDOW tokens, shorter than the test documents, so they change the function. `overrides` (the GPU tests:
head_dim 64 for the FlashAttention kernels, a longer window) replace any of the keys."""

from __future__ import annotations

from typing import Any

WINDOW = 5
COMMON: dict[str, Any] = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
                              num_hidden_layers=2, head_dim=16)
LOCAL_GLOBAL = ["sliding_attention", "full_attention"]
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
# family: (transformers config class, its keys beyond COMMON)
SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3.1": ("LlamaConfig", {"rope_parameters": LLAMA3_ROPE}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "qwen2.5": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "gemma3": ("Gemma3TextConfig", {"query_pre_attn_scalar": 24, "sliding_window": WINDOW,
                                    "layer_types": LOCAL_GLOBAL}),
    # max_position_embeddings: its YaRN RoPE's original context (no mismatch warning)
    "gpt-oss": ("GptOssConfig", {"intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                                 "sliding_window": WINDOW, "layer_types": LOCAL_GLOBAL,
                                 "max_position_embeddings": 4096}),
    "qwen3-moe": ("Qwen3MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "decoder_sparse_step": 1}),
}
FAMILIES = tuple(SPECS)


def family_config(name: str, **overrides: Any):
    """A fresh config of family `name` (tests set `_attn_implementation` on it)."""
    import transformers

    class_name, keys = SPECS[name]
    return getattr(transformers, class_name)(**{**COMMON, **keys, **overrides})
