"""bench/peers/parity_trl.py's `--packs ours` feeds TRL bench/arithmetic.our_packs: those rows must be the micro-batches
our training loop takes from the same corpus file under gpu_parity's train.toml (same seed and budget), token for
token and document for document, so both sides of the parity benchmark step on the same tokens. Runs without
trl (CI has none): our_packs lives outside the TRL module."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common.arithmetic import our_packs, write_corpus
from bench.suites.gpu_parity import write_train_toml
from bench.common.synthetic import read_token_jsonl
from contract.config import SHIPPED_TOKENIZER, load_train_config
from train.dataset.load import build_datasets, load_tokenizer, pad_id
from train.engine.loop import Batches

STEPS, BUDGET = 5, 512


def test_our_packs_are_the_micro_batches_our_loop_trains_on(tmp_path: Path) -> None:
    docs, _ = write_corpus(tmp_path / "data", train_docs=60, eval_docs=1)
    args = argparse.Namespace(cpu_smoke=True, budget=BUDGET, steps=STEPS, lr=3e-4, warmup_ratio=0.03)
    cfg = load_train_config(write_train_toml(tmp_path / "run", SHIPPED_TOKENIZER, docs, args, {}))
    tokenizer = load_tokenizer(cfg)
    bundle = build_datasets(cfg, tokenizer)
    batches = Batches(bundle.train, list(bundle.train["length"]), cfg.micro_batch_tokens, cfg.train.seed,
                      packed=True, pad_id=pad_id(tokenizer), mixture=bundle.mixture)
    ours = [batches.collate(indices) for indices in batches.plan(0)[:STEPS]]

    rows = our_packs(read_token_jsonl(docs), BUDGET, cfg.train.seed, STEPS)

    assert len(rows["input_ids"]) == len(rows["seq_lengths"]) == STEPS
    assert rows["input_ids"] == [batch["input_ids"][0].tolist() for batch in ours]
    assert rows["seq_lengths"] == [batch["cu_seq_lens_q"].diff().tolist() for batch in ours]
    assert all(len(row) <= BUDGET for row in rows["input_ids"])
    assert any(len(lengths) > 1 for lengths in rows["seq_lengths"])  # rows that pack several documents


def test_our_packs_follow_the_seed() -> None:
    docs = [[i] * (1 + i % 7) for i in range(40)]
    assert our_packs(docs, 16, seed=1, steps=4) == our_packs(docs, 16, seed=1, steps=4)
    assert our_packs(docs, 16, seed=1, steps=4) != our_packs(docs, 16, seed=2, steps=4)
    long = our_packs([[7] * 50], 16, seed=0, steps=1)  # a document longer than the budget: truncated, as ours
    assert long == {"input_ids": [[7] * 16], "seq_lengths": [[16]]}
