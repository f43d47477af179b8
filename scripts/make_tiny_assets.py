"""Regenerate train/assets/: the synthetic sample chat dataset and the tiny byte-level BPE tokenizer.

Deterministic (fixed seed, tokenizers trained single-threaded on the same text), so re-running it
reproduces the shipped files. Run: `python scripts/make_tiny_assets.py [--out train/assets]`.
The data is templated arithmetic and facts: a tiny random model can learn it quickly, so its loss
visibly falls in smoke runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

SEED = 1234
NUM_CONVERSATIONS = 300
VOCAB_SIZE = 512  # total, special tokens included (the `tiny` preset's vocab_size)

BOS, EOS_TEXT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
START_HEADER, END_HEADER, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS_TEXT, PAD, START_HEADER, END_HEADER, EOT]

# Llama-3-like. The assistant reply *and* its end-of-turn token sit inside {% generation %} so
# `return_assistant_tokens_mask=True` marks exactly the tokens the model must learn to produce.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "Canada": "Ottawa", "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo",
    "Greece": "Athens", "Chile": "Santiago", "Cuba": "Havana", "Poland": "Warsaw", "Ireland": "Dublin",
}
WORDS = ["cat", "river", "apple", "stone", "light", "garden", "music", "cloud", "paper", "window"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "Answer briefly.", "You are a careful math tutor."]


def arithmetic_turns(rng: random.Random) -> list[tuple[str, str]]:
    """One question (and sometimes a follow-up) about a small sum or product."""
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    op = rng.choice(["+", "*", "-"])
    result = {"+": a + b, "*": a * b, "-": a - b}[op]
    turns = [(f"What is {a} {op} {b}?", f"{a} {op} {b} = {result}.")]
    if rng.random() < 0.4:
        k = rng.randint(2, 5)
        turns.append((f"And what is that times {k}?", f"{result} * {k} = {result * k}."))
    return turns


def fact_turns(rng: random.Random) -> list[tuple[str, str]]:
    country = rng.choice(sorted(CAPITALS))
    turns = [(f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}.")]
    if rng.random() < 0.3:
        other = rng.choice(sorted(CAPITALS))
        turns.append((f"And of {other}?", f"The capital of {other} is {CAPITALS[other]}."))
    return turns


def word_turns(rng: random.Random) -> list[tuple[str, str]]:
    word = rng.choice(WORDS)
    if rng.random() < 0.5:
        return [(f"Spell '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'.")]
    return [(f"How many letters are in '{word}'?", f"'{word}' has {len(word)} letters.")]


def make_conversations(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    makers = [arithmetic_turns, fact_turns, word_turns]
    rows = []
    for i in range(n):
        turns = rng.choice(makers)(rng)
        if rng.random() < 0.2:  # some conversations chain two topics
            turns += rng.choice(makers)(rng)
        conv = []
        if rng.random() < 0.3:
            conv.append({"from": "system", "value": rng.choice(SYSTEM_PROMPTS)})
        for question, answer in turns:
            conv += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        rows.append({"id": f"sample-{i:04d}", "conversations": conv})
    return rows


def training_text(rows: list[dict]) -> list[str]:
    """The text the BPE merges are learned from: every turn, plus the header role names (once per
    conversation, so they become single tokens as in real chat tokenizers)."""
    texts = []
    for row in rows:
        texts += ["system", "user", "assistant", "\n\n"]
        texts += [turn["value"] for turn in row["conversations"]]
    return texts


def build_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable: no <unk>
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,  # as Llama-3-Instruct: generation stops at the end of the assistant turn
        pad_token=PAD,
        additional_special_tokens=[EOS_TEXT, START_HEADER, END_HEADER],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "train" / "assets"))
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"  # BPE training is deterministic single-threaded
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = make_conversations(NUM_CONVERSATIONS, SEED)
    with open(out / "sample_chat.jsonl", "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tokenizer = build_tokenizer(training_text(rows))
    assert len(tokenizer) <= VOCAB_SIZE, len(tokenizer)
    tokenizer.save_pretrained(out / "tiny-tokenizer")
    print(f"wrote {len(rows)} conversations and a {len(tokenizer)}-token tokenizer to {out}")


if __name__ == "__main__":
    main()
