"""Assistant masks under the real chat templates of the preset families (`sft-launch models`).

The templates (tests/fixtures/chat_templates/, sources in its README) have no `{% generation %}`
markers, so train.dataset.chat masks them turn by turn. Each family gets a tokenizer built here from the
shipped tiny tokenizer plus that family's special tokens, saved and loaded back through
`train.dataset.load.load_tokenizer` as a training run would load it, and its labels are compared with
hand-built expectations: exactly each assistant reply and its end-of-turn token carry loss.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from contract.schema import ConfigError

from tests.train.conftest import SAMPLE_CHAT
from tests.train.test_data import (
    BOS, EOT, MULTI_TURN_EXPECTED, expected, header, learned_text, make_cfg, only_example, write_jsonl,
)
from train.dataset.chat import IGNORE_INDEX, has_generation_markers, tokenize_chat
from train.dataset.load import build_datasets, load_tokenizer

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Family:
    template: str  # file in TEMPLATES
    bos: str | None
    eos: str
    specials: tuple[str, ...] = ()  # further special tokens of the family's tokenizer
    learned: str = "{reply}{eos}"  # the learned text of one assistant turn, as the template renders it


FAMILIES = {
    "llama-2": Family("llama-2-chat.jinja", "<s>", "</s>", learned=" {reply} {eos}"),  # llama-7b/13b/70b
    "llama-3": Family("llama-3-instruct.jinja", BOS, EOT),  # llama3-8b/70b
    "llama-3.2": Family("llama-3.2-instruct.jinja", BOS, EOT),  # llama3.2-1b
    "mistral": Family("mistral-7b-instruct-v0.2.jinja", "<s>", "</s>", learned=" {reply}{eos}"),  # mistral-7b
    "qwen2.5": Family("qwen2.5-instruct.jinja", None, "<|im_end|>", ("<|im_start|>", "<|endoftext|>")),
}


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory, tiny_tokenizer):
    """name -> the tiny tokenizer with the family's special tokens and real template, as loaded by train."""
    loaded = {}
    for name, family in FAMILIES.items():
        tokenizer = copy.deepcopy(tiny_tokenizer)
        tokenizer.add_tokens([t for t in (family.bos, family.eos, *family.specials) if t], special_tokens=True)
        tokenizer.bos_token, tokenizer.eos_token = family.bos, family.eos
        tokenizer.chat_template = (TEMPLATES / family.template).read_text(encoding="utf-8")
        directory = tmp_path_factory.mktemp(name)
        tokenizer.save_pretrained(directory)
        cfg = make_cfg(directory)
        cfg.model.tokenizer = str(directory)
        loaded[name] = load_tokenizer(cfg)
    return loaded


SYSTEM, Q1, A1, Q2, A2 = "Answer briefly.", "What is 2 + 3?", "2 + 3 = 5.", "And times 2?", "5 * 2 = 10."
CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": Q1}, {"role": "assistant", "content": A1},
    {"role": "user", "content": Q2}, {"role": "assistant", "content": A2},
]


def llama32_system(date: str, system: str) -> str:
    return header("system") + f"Cutting Knowledge Date: December 2023\nToday Date: {date}\n\n{system}" + EOT


def qwen_turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def hand_built(family: str, date: str = "") -> list[tuple[str, bool]]:
    """CONVERSATION as each template renders it, split into (text, carries loss)."""
    if family == "llama-2":  # system inside the first [INST]; every turn starts with <s>; " reply </s>"
        first = f"<s>[INST] <<SYS>>\n{SYSTEM}\n<</SYS>>\n\n{Q1} [/INST]"
        return [(first, False), (f" {A1} </s>", True), (f"<s>[INST] {Q2} [/INST]", False), (f" {A2} </s>", True)]
    if family == "mistral":  # v0.2: system + "\n\n" prepended to the first user turn
        first = f"<s> [INST] {SYSTEM}\n\n{Q1} [/INST]"
        return [(first, False), (f" {A1}</s>", True), (f" [INST] {Q2} [/INST]", False), (f" {A2}</s>", True)]
    if family == "llama-3":
        return MULTI_TURN_EXPECTED
    if family == "llama-3.2":  # the system header always carries the knowledge cutoff and today's date
        first = BOS + llama32_system(date, SYSTEM) + header("user") + Q1 + EOT + header("assistant")
        return [(first, False), (A1 + EOT, True), (header("user") + Q2 + EOT + header("assistant"), False),
                (A2 + EOT, True)]
    # qwen2.5: the "\n" after <|im_end|> separates turns; the model never generates it
    first = qwen_turn("system", SYSTEM) + qwen_turn("user", Q1) + "<|im_start|>assistant\n"
    return [(first, False), (A1 + "<|im_end|>", True),
            ("\n" + qwen_turn("user", Q2) + "<|im_start|>assistant\n", False), (A2 + "<|im_end|>", True), ("\n", False)]


def today() -> str:
    return datetime.now().strftime("%d %b %Y")  # what transformers' strftime_now renders


def build_one(tmp_path, tokenizer, messages) -> tuple[tuple[list[int], list[int]], str]:
    """The single example of a one-row data file, and the date around its tokenization."""
    before = today()
    example = only_example(make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [{"messages": messages}])), tokenizer)
    if today() != before:
        pytest.skip("the date changed while tokenizing (the Llama-3.2 template renders today's date)")
    return example, before


@pytest.mark.parametrize("family", FAMILIES)
def test_real_template_multi_turn_with_system(tmp_path, family_tokenizers, family):
    tokenizer = family_tokenizers[family]
    assert not has_generation_markers(tokenizer)  # the turn-by-turn path
    (ids, labels), date = build_one(tmp_path, tokenizer, CONVERSATION)
    segments = hand_built(family, date)
    assert tokenizer.apply_chat_template(CONVERSATION, tokenize=False) == "".join(text for text, _ in segments)
    assert (ids, labels) == expected(tokenizer, segments)
    assert learned_text(tokenizer, labels) == "".join(text for text, learn in segments if learn)


def test_qwen_default_system_prompt_is_not_learned(tmp_path, family_tokenizers):
    tokenizer = family_tokenizers["qwen2.5"]
    (ids, labels), _ = build_one(tmp_path, tokenizer, CONVERSATION[1:3])
    default = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert (ids, labels) == expected(tokenizer, [
        (qwen_turn("system", default) + qwen_turn("user", Q1) + "<|im_start|>assistant\n", False),
        (A1 + "<|im_end|>", True), ("\n", False),
    ])


def test_llama32_without_system_prompt_still_renders_the_date_header(tmp_path, family_tokenizers):
    tokenizer = family_tokenizers["llama-3.2"]
    (ids, labels), date = build_one(tmp_path, tokenizer, CONVERSATION[1:3])
    assert (ids, labels) == expected(tokenizer, [
        (BOS + llama32_system(date, "") + header("user") + Q1 + EOT + header("assistant"), False), (A1 + EOT, True),
    ])


def test_llama2_renders_as_transformers_did_upstream(family_tokenizers):
    """The rendering mistral.rs's test_chat_templates recorded from transformers for Llama-2-13b-chat-hf."""
    turns = [("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
             ("user", "Who are you"), ("assistant", "   I am an assistant   "), ("user", "Another question")]
    rendered = family_tokenizers["llama-2"].apply_chat_template(
        [{"role": role, "content": content} for role, content in turns], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
        "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"
    )


def test_llama3_template_turn_by_turn_equals_generation_markers(tmp_path, tiny_tokenizer):
    """The tiny template is Llama-3's with {% generation %} markers: both paths must agree on every row."""
    cfg = make_cfg(tmp_path)  # the shipped sample set: multi-turn rows, with and without system turns
    with_markers = build_datasets(cfg, tiny_tokenizer).train
    real = copy.deepcopy(tiny_tokenizer)
    real.chat_template = (TEMPLATES / "llama-3-instruct.jinja").read_text(encoding="utf-8")
    assert has_generation_markers(tiny_tokenizer) and not has_generation_markers(real)
    cfg.run.dir = str(tmp_path / "run2")
    turn_by_turn = build_datasets(cfg, real)
    assert turn_by_turn.stats["skipped"] == 0
    assert turn_by_turn.train["input_ids"] == with_markers["input_ids"]
    assert turn_by_turn.train["labels"] == with_markers["labels"]


EDGE_CASES = {
    "padded reply": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  padded  "}],
    "newlines around the reply": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\n\nx\n\n"}],
    "trailing user turn": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                           {"role": "user", "content": "more?"}],
    "adjacent replies": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "one"},
                         {"role": "assistant", "content": "two"}],
    "non-ASCII": [{"role": "system", "content": "sÿs"}, {"role": "user", "content": "héllo 日本"},
                  {"role": "assistant", "content": "réponse 日本語"}],
}


@pytest.mark.parametrize("case", EDGE_CASES)
def test_llama3_turn_by_turn_equals_generation_markers_on_edge_cases(tiny_tokenizer, case):
    real = copy.deepcopy(tiny_tokenizer)
    real.chat_template = (TEMPLATES / "llama-3-instruct.jinja").read_text(encoding="utf-8")
    messages = EDGE_CASES[case]
    assert tokenize_chat(real, messages, False) == tokenize_chat(tiny_tokenizer, messages, True)


def learned_spans(tokenizer, labels: list[int]) -> list[str]:
    """The decoded runs of consecutive learned tokens."""
    spans, run = [], []
    for label in [*labels, IGNORE_INDEX]:
        if label != IGNORE_INDEX:
            run.append(label)
        elif run:
            spans.append(tokenizer.decode(run))
            run = []
    return spans


@pytest.mark.parametrize("family", FAMILIES)
def test_sample_set_learns_each_reply_and_its_end_of_turn(tmp_path, family_tokenizers, family):
    """Every row of the shipped sample set: one learned span per assistant turn, the reply then the eos."""
    tokenizer, spec = family_tokenizers[family], FAMILIES[family]
    bundle = build_datasets(make_cfg(tmp_path), tokenizer)
    assert bundle.stats["skipped"] == 0 and len(bundle.train) == bundle.stats["rows"]
    rows = [json.loads(line) for line in SAMPLE_CHAT.read_text(encoding="utf-8").splitlines()]
    for row, labels in zip(rows, bundle.train["labels"]):
        replies = [turn["value"] for turn in row["conversations"] if turn["from"] == "gpt"]
        assert learned_spans(tokenizer, labels) == [spec.learned.format(reply=r, eos=spec.eos) for r in replies]


ALTERNATING = [{"role": "user", "content": Q1}, {"role": "assistant", "content": A1}]
NOT_ALTERNATING = [{"role": "user", "content": Q1}, {"role": "user", "content": Q2},
                   {"role": "assistant", "content": A2}]
ASSISTANT_FIRST = [{"role": "assistant", "content": A1}, {"role": "user", "content": Q1},
                   {"role": "assistant", "content": A2}]


@pytest.mark.parametrize("family", ["llama-2", "mistral"])
def test_conversation_the_template_rejects_is_skipped_and_counted(tmp_path, family_tokenizers, family):
    """Llama-2 and Mistral raise on non-alternating roles: the row is refused by its location, or with
    data.skip_unrenderable skipped with the template's reason."""
    rows = [{"messages": m} for m in (ALTERNATING, NOT_ALTERNATING, ALTERNATING, ASSISTANT_FIRST)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ConfigError, match=rf"^{path}:2: assistant mask: chat template failed: .*roles must alternate"):
        build_datasets(make_cfg(tmp_path, path), family_tokenizers[family])
    bundle = build_datasets(make_cfg(tmp_path, path, skip_unrenderable=True), family_tokenizers[family])
    assert len(bundle.train) == 2
    assert bundle.stats["skipped_mask"] == bundle.stats["skipped"] == 2
    assert [line.split(": ", 1)[0] for line in bundle.stats["skipped_examples"]] == [
        f"row 1 ({path}:2)", f"row 3 ({path}:4)"]
    assert all("roles must alternate" in line for line in bundle.stats["skipped_examples"])


def test_llama3_accepts_what_llama2_rejects(tmp_path, family_tokenizers):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": NOT_ALTERNATING}])
    ids, labels = only_example(make_cfg(tmp_path, path), family_tokenizers["llama-3"])
    assert learned_text(family_tokenizers["llama-3"], labels) == A2 + EOT


def test_prefix_inconsistent_template_is_skipped_with_reason(tmp_path, family_tokenizers):
    """Qwen2.5's template, altered to drop earlier replies once a later one follows (as reasoning
    templates drop earlier thoughts): rendering turns 1..k is no prefix of rendering 1..k+1."""
    tokenizer = copy.deepcopy(family_tokenizers["qwen2.5"])
    reply = "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'"
    assert tokenizer.chat_template.count(reply) == 1
    emptied = "'<|im_start|>assistant\\n<|im_end|>\\n'"
    tokenizer.chat_template = tokenizer.chat_template.replace(
        reply, f"({emptied} if message.role == 'assistant' and not loop.last else {reply})"
    )
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": ALTERNATING}, {"messages": CONVERSATION}])
    bundle = build_datasets(make_cfg(tmp_path, path, skip_unrenderable=True), tokenizer)
    assert len(bundle.train) == 1
    assert bundle.stats["skipped_mask"] == 1
    assert bundle.stats["skipped_examples"] == [  # the earlier reply is not in the training text
        f"row 1 ({path}:2): assistant mask: the chat template leaves out messages[2]: assistant text {A1!r}"]


def test_all_rows_unmaskable_fails_with_the_reason(tmp_path, tiny_tokenizer):
    """A base model's tokenizer often has no chat template (Llama-2-7b-hf, Mistral-7B-v0.1)."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = None
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": ALTERNATING}] * 2)
    with pytest.raises(ConfigError, match=rf"^{path}:1: assistant mask: the tokenizer has no chat template"):
        build_datasets(make_cfg(tmp_path, path), tokenizer)
    with pytest.raises(ConfigError, match=rf"^{path}: no usable examples \(2 rows, 2 skipped; first: row 0 "
                                          rf"\({path}:1\): assistant mask: the tokenizer has no chat template\)$"):
        build_datasets(make_cfg(tmp_path, path, skip_unrenderable=True), tokenizer)
