"""A learnable SFT corpus for bench/suites/gpu_parity.py: multi-turn chats of integer arithmetic.

Each conversation has 2-16 turns of "What is 37 + 485?" / "37 + 485 = 522" (+, - and x of numbers
up to 999), rendered with the shipped tokenizer's chat template into token ids: the prompt numbers are
noise, the answers and the format can be learned, so the loss has somewhere to go. Deterministic in
the seed; written as bench/common/synthetic.py's token documents ({"input_ids": [...]}, loss on every token).
`our_packs`: the rows our loader packs them into, in its order (what bench/peers/parity_trl.py feeds TRL).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from contract.config import SHIPPED_TOKENIZER
from train.dataset.packing import plan_micro_batches

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "x": lambda a, b: a * b}


def chat(rng: random.Random) -> list[dict[str, str]]:
    messages = []
    for _ in range(rng.randint(1, 8)):
        a, b, op = rng.randint(0, 999), rng.randint(0, 999), rng.choice(sorted(OPERATIONS))
        messages += [{"role": "user", "content": f"What is {a} {op} {b}?"},
                     {"role": "assistant", "content": f"{a} {op} {b} = {OPERATIONS[op](a, b)}"}]
    return messages


def token_documents(n: int, seed: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_TOKENIZER, local_files_only=True)
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        ids = tokenizer.apply_chat_template(chat(rng), tokenize=True)
        docs.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return docs


def write_corpus(folder: Path, train_docs: int, eval_docs: int, seed: int = 0) -> tuple[Path, list[list[int]]]:
    """train.jsonl of `train_docs` documents, and the `eval_docs` held-out ones (another seed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train.jsonl"
    with path.open("w") as f:
        for ids in token_documents(train_docs, seed):
            f.write(json.dumps({"input_ids": ids}) + "\n")
    return path, token_documents(eval_docs, seed + 1)


def our_packs(docs: list[list[int]], budget: int, seed: int, steps: int) -> dict[str, list[list[int]]]:
    """Our first `steps` packed rows (one per optimizer step on one GPU), in our order: train/dataset/packing.py's
    plan for `seed`, epoch 0, each row the concatenated documents (each truncated to the budget, as our loader
    does) under `input_ids` and their lengths under `seq_lengths` (TRL's padding-free collator)."""
    docs = [doc[:budget] for doc in docs]
    plan = plan_micro_batches([len(doc) for doc in docs], budget, seed, 0)[:steps]
    return {"input_ids": [[t for i in row for t in docs[i]] for row in plan],
            "seq_lengths": [[len(docs[i]) for i in row] for row in plan]}
