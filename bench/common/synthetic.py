"""Synthetic SFT data shaped like ShareGPT, shared by every GPU benchmark so both sides of a
comparison see the same documents.

Lengths follow lognormal(mu=6.3, sigma=0.9) clipped to [32, 4096] (the ShareGPT-like distribution
the performance issue measured); token ids are uniform over the vocabulary; every token carries
loss (plain-text SFT), so "real tokens" = non-padding tokens on both sides.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import math

LLAMA_1B = dict(  # Llama-3.2-1B shape
    hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
    intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=131072,
)
LLAMA_8B = dict(  # Llama-3-8B shape
    hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
    intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False, max_position_embeddings=8192,
)
SHAPES = {"llama3.2-1b": LLAMA_1B, "llama3-8b": LLAMA_8B}
MAX_DOC_TOKENS = 4096  # the longest document (clipped to the micro-batch budget)


def sample_lengths(n: int, seed: int = 0, mu: float = 6.3, sigma: float = 0.9,
                   lo: int = 32, hi: int = MAX_DOC_TOKENS) -> list[int]:
    rng = random.Random(seed)
    return [min(hi, max(lo, int(math.exp(rng.gauss(mu, sigma))))) for _ in range(n)]


def document_lengths(docs: int, budget: int) -> list[int]:
    """The synthetic documents a one-GPU run of `docs` documents at micro-batch `budget` trained on."""
    return sample_lengths(docs, seed=0, hi=min(MAX_DOC_TOKENS, budget))


def attended_length(lengths: list[int]) -> float:
    """s̄ = Σ nᵢ² / Σ nᵢ (contract/shape.py)."""
    return sum(n * n for n in lengths) / sum(lengths)


def write_token_jsonl(path: Path, lengths: list[int], vocab_size: int, seed: int = 0) -> int:
    """One {"input_ids": [...]} row per document; returns the total number of tokens."""
    rng = random.Random(seed + 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for length in lengths:
            # Avoid the first ids (often special tokens in real vocabularies).
            ids = [rng.randrange(1000, vocab_size) for _ in range(length)]
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return sum(lengths)


def read_token_jsonl(path: Path) -> list[list[int]]:
    with path.open() as f:
        return [json.loads(line)["input_ids"] for line in f]
