"""Shared fixtures for train/ tests: the shipped tiny tokenizer and a tiny random Llama.

The model config has GQA (2 KV heads for 4 query heads) so attention backends are exercised on
the same head layout as real Llama models.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ASSETS = Path(__file__).resolve().parents[2] / "train" / "assets"
TINY_TOKENIZER_DIR = ASSETS / "tiny-tokenizer"
SAMPLE_CHAT = ASSETS / "sample_chat.jsonl"

# LlamaConfig kwargs (Hugging Face key names), small enough for CPU tests that run in seconds.
TINY_ARCH = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR, local_files_only=True)


@pytest.fixture
def tiny_model_config():
    """A fresh `LlamaConfig` per test (tests may change `_attn_implementation` on it)."""
    from transformers import LlamaConfig

    return LlamaConfig(**TINY_ARCH)
