"""Data: formats, assistant masks against hand-built expectations, bad rows by file:line, cache."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from contract.schema import ConfigError
from train.dataset.chat import IGNORE_INDEX
from contract.config import TrainConfig
from train.dataset.load import build_datasets, load_tokenizer
from contract.failure import PeerFailedError

BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"


def header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


def expected(tokenizer, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """Hand-built (input_ids, labels): the concatenated text tokenized once; tokens inside a segment
    marked True carry loss. Tokens must not straddle segments (they would make the spec ambiguous)."""
    text = "".join(piece for piece, _ in segments)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    learn_chars, position = [], 0
    for piece, learn in segments:
        learn_chars += [learn] * len(piece)
        position += len(piece)
    labels = []
    for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        assert len(set(learn_chars[start:end])) == 1, "a token straddles two segments"
        labels.append(token if learn_chars[start] else IGNORE_INDEX)
    return list(encoded["input_ids"]), labels


def learned_text(tokenizer, labels: list[int]) -> str:
    return tokenizer.decode([label for label in labels if label != IGNORE_INDEX])


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_cfg(tmp_path: Path, data_path: Path | str = "", **data) -> TrainConfig:
    cfg = TrainConfig()
    cfg.run.dir = str(tmp_path / "run")
    cfg.data.path = str(data_path)
    for key, value in data.items():
        setattr(cfg.data, key, value)
    return cfg


def only_example(cfg, tokenizer) -> tuple[list[int], list[int]]:
    bundle = build_datasets(cfg, tokenizer)
    assert len(bundle.train) == 1
    return bundle.train[0]["input_ids"], bundle.train[0]["labels"]


MULTI_TURN_EXPECTED = [
    (BOS + header("system") + "Answer briefly." + EOT + header("user") + "What is 2 + 3?" + EOT + header("assistant"), False),
    ("2 + 3 = 5." + EOT, True),
    (header("user") + "And times 2?" + EOT + header("assistant"), False),
    ("5 * 2 = 10." + EOT, True),
]


def test_sharegpt_multi_turn_with_system(tmp_path, tiny_tokenizer):
    row = {"conversations": [
        {"from": "system", "value": "Answer briefly."},
        {"from": "human", "value": "What is 2 + 3?"}, {"from": "gpt", "value": "2 + 3 = 5."},
        {"from": "human", "value": "And times 2?"}, {"from": "gpt", "value": "5 * 2 = 10."},
    ]}
    cfg = make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [row]))
    ids, labels = only_example(cfg, tiny_tokenizer)
    assert (ids, labels) == expected(tiny_tokenizer, MULTI_TURN_EXPECTED)
    assert learned_text(tiny_tokenizer, labels) == "2 + 3 = 5.<|eot_id|>5 * 2 = 10.<|eot_id|>"


def test_openai_messages(tmp_path, tiny_tokenizer):
    row = {"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5."},
        {"role": "user", "content": "And times 2?"}, {"role": "assistant", "content": "5 * 2 = 10."},
    ]}
    cfg = make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [row]), format="messages")
    assert only_example(cfg, tiny_tokenizer) == expected(tiny_tokenizer, MULTI_TURN_EXPECTED)


def test_alpaca_with_input(tmp_path, tiny_tokenizer):
    row = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}
    cfg = make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [row]))
    assert only_example(cfg, tiny_tokenizer) == expected(tiny_tokenizer, [
        (BOS + header("user") + "Add the numbers.\n\n2 and 3" + EOT + header("assistant"), False),
        ("5" + EOT, True),
    ])


def test_plain_text_learns_every_token(tmp_path, tiny_tokenizer):
    cfg = make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [{"body": "The capital of Peru is Lima."}]),
                   text_field="body")
    ids, labels = only_example(cfg, tiny_tokenizer)
    assert (ids, labels) == expected(tiny_tokenizer, [(BOS + "The capital of Peru is Lima." + EOT, True)])


def test_pretokenized_rows(tmp_path, tiny_tokenizer):
    rows = [{"input_ids": [0, 7, 8, 9]}, {"input_ids": [0, 7, 8], "labels": [-100, -100, 8]}]
    bundle = build_datasets(make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows)), tiny_tokenizer)
    assert bundle.stats["format"] == "tokens"
    assert bundle.train["labels"] == [[0, 7, 8, 9], [-100, -100, 8]]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"input_ids": [1, 2], "labels": [1]}])
    with pytest.raises(ConfigError, match=rf"^{bad}:1: field 'labels' must be a list of 2 ints"):
        build_datasets(make_cfg(tmp_path, bad), tiny_tokenizer)


def without_generation_markers(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = tokenizer.chat_template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return plain


def test_turn_by_turn_fallback_equals_template_markers(tmp_path, tiny_tokenizer):
    cfg = make_cfg(tmp_path)  # the shipped sample set: multi-turn and system turns
    with_markers = build_datasets(cfg, tiny_tokenizer).train
    cfg.run.dir = str(tmp_path / "run2")
    fallback = build_datasets(cfg, without_generation_markers(tiny_tokenizer)).train
    assert with_markers["labels"] == fallback["labels"]
    assert with_markers["input_ids"] == fallback["input_ids"]


def test_unmaskable_sample_is_skipped_and_reported(tmp_path, tiny_tokenizer):
    tokenizer = without_generation_markers(tiny_tokenizer)
    # Renders a prefix differently from the whole conversation once there are > 2 messages.
    tokenizer.chat_template = "{% if messages|length > 2 %}{{ messages|length }}{% endif %}" + tokenizer.chat_template
    short = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
    long = {"conversations": short["conversations"] * 2}
    cfg = make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", [short, long, short]), skip_unrenderable=True)
    bundle = build_datasets(cfg, tokenizer)
    assert len(bundle.train) == 2
    assert bundle.stats["skipped_mask"] == bundle.stats["skipped"] == 1
    assert bundle.stats["skipped_examples"][0].startswith(f"row 1 ({tmp_path / 'd.jsonl'}:2)")


GOOD = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
BAD_ROWS = [
    ({"conversations": [{"from": "human", "value": "Hi"}]}, "no assistant turn"),
    ({"conversations": [{"from": "robot", "value": "Hi"}, {"from": "gpt", "value": "x"}]}, "unknown role 'robot'"),
    ({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "  "}]}, "'value' is empty"),
    ({"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]}, "needs 'from' and 'value'"),
    ({"text": "wrong format"}, "must be a non-empty list"),
]


@pytest.mark.parametrize(("row", "reason"), BAD_ROWS)
def test_bad_row_names_file_and_line(tmp_path, tiny_tokenizer, row, reason):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD, GOOD, row])
    with pytest.raises(ConfigError, match=reason) as info:
        build_datasets(make_cfg(tmp_path, path), tiny_tokenizer)
    assert str(info.value).startswith(f"{path}:3: ")


def test_non_utf8_and_invalid_json_lines(tmp_path, tiny_tokenizer):
    path = tmp_path / "d.jsonl"
    good = json.dumps(GOOD).encode()
    path.write_bytes(good + b"\n" + b'{"conversations": "\xff\xfe"}\n' + good + b"\n{not json\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2: not valid UTF-8"):
        build_datasets(make_cfg(tmp_path, path), tiny_tokenizer)
    bundle = build_datasets(make_cfg(tmp_path, path, allow_bad_rows=True), tiny_tokenizer)
    assert len(bundle.train) == 2
    assert bundle.stats["skipped_bad_rows"] == 2 and bundle.stats["rows"] == 4
    assert f"{path}:4" in bundle.stats["skipped_examples"][1]


def test_json_array_parquet_and_saved_dataset_agree_with_jsonl(tmp_path, tiny_tokenizer):
    import datasets

    rows = [GOOD, {"conversations": [{"from": "human", "value": "2 + 2?"}, {"from": "gpt", "value": "4."}]}]
    reference = build_datasets(make_cfg(tmp_path, write_jsonl(tmp_path / "d.jsonl", rows)), tiny_tokenizer).train
    (tmp_path / "d.json").write_text(json.dumps(rows, indent=2))
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "d.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    for name in ("d.json", "d.parquet", "saved"):
        loaded = build_datasets(make_cfg(tmp_path, tmp_path / name), tiny_tokenizer).train
        assert loaded["labels"] == reference["labels"], name


def test_json_array_bad_row_line(tmp_path, tiny_tokenizer):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([GOOD, {"conversations": []}], indent=2))
    with pytest.raises(ConfigError, match=rf"^{path}:14: "):  # the line where the second object starts
        build_datasets(make_cfg(tmp_path, path), tiny_tokenizer)


def test_cache_hit_on_second_call_and_miss_after_change(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD] * 3)
    cfg = make_cfg(tmp_path, path)
    first = build_datasets(cfg, tiny_tokenizer)
    second = build_datasets(cfg, tiny_tokenizer, is_main=False, barrier=lambda: None)
    assert not first.stats["cache_hit"] and second.stats["cache_hit"]
    assert second.train["input_ids"] == first.train["input_ids"]
    assert len(list((tmp_path / "run" / "cache").glob("tokenized-*"))) == 1
    write_jsonl(path, [GOOD] * 4)
    os.utime(path, ns=(0, 1))  # a different mtime even on coarse-timestamp filesystems
    third = build_datasets(cfg, tiny_tokenizer)
    assert not third.stats["cache_hit"] and len(third.train) == 4


def test_non_main_process_without_cache_fails_clearly(tmp_path, tiny_tokenizer):
    calls = []
    # A follow-on of the main process's failure (contract/failure.py), not a configuration error of its own.
    with pytest.raises(PeerFailedError, match="tokenized cache missing"):
        build_datasets(make_cfg(tmp_path), tiny_tokenizer, is_main=False, barrier=lambda: calls.append(1))
    assert calls == [1]


def test_truncation_is_counted_and_logged_with_the_longest_the_plan_counted(tmp_path, tiny_tokenizer, caplog):
    """A cut is never silent: one warning at tokenize time (how many, the longest), and the longest is the
    one the plan's tokenizer count found before the queue (launcher/resolve/plan_sources.py)."""
    from types import SimpleNamespace

    from launcher.resolve.plan_sources import estimate_source
    from launcher.resolve.profile import ClusterProfile

    cfg = make_cfg(tmp_path)
    cfg.train.model_max_length = 40
    with caplog.at_level("WARNING", logger="train.dataset.tokenize"):
        bundle = build_datasets(cfg, tiny_tokenizer)
    assert bundle.stats["truncated"] > 0
    assert max(bundle.train["length"]) <= 40
    assert bundle.stats["rows"] == bundle.stats["examples"] + bundle.stats["skipped"]
    planned = estimate_source(SimpleNamespace(profile=ClusterProfile(), train=cfg, data_checks=[]),
                              cfg.data.source_list()[0])
    assert (planned.longer, planned.longest) == (bundle.stats["truncated"], bundle.stats["longest_cut"])
    cut = [r.getMessage() for r in caplog.records if "longer than model_max_length" in r.getMessage()]
    assert cut == [f"{cfg.data.source_list()[0].path}: {planned.longer} document(s) longer than model_max_length 40 "
                   f"cut to it (the longest {planned.longest} tokens); keep them whole with a larger "
                   "train.model_max_length (or auto), split over GPUs with --context_parallel"]


def test_eval_fraction_is_deterministic_and_disjoint(tmp_path, tiny_tokenizer):
    cfg = make_cfg(tmp_path, eval_fraction=0.1)
    a, b = build_datasets(cfg, tiny_tokenizer), build_datasets(cfg, tiny_tokenizer)
    # 30 held out, 10 of which the sample also has among the 270 kept (duplicates): trained, so not evaluated on
    assert len(a.eval) == 20 and len(a.train) == 280 and a.stats["eval_examples"] == 20
    assert not {tuple(ids) for ids in a.eval["input_ids"]} & {tuple(ids) for ids in a.train["input_ids"]}
    assert a.eval["input_ids"] == b.eval["input_ids"]
    cfg.train.seed += 1
    assert build_datasets(cfg, tiny_tokenizer).eval["input_ids"] != a.eval["input_ids"]


def test_eval_path(tmp_path, tiny_tokenizer):
    cfg = make_cfg(tmp_path, eval_path=str(write_jsonl(tmp_path / "e.jsonl", [GOOD] * 2)))
    bundle = build_datasets(cfg, tiny_tokenizer)
    assert len(bundle.eval) == 2 and bundle.stats["eval"]["examples"] == 2


def test_load_tokenizer(tmp_path):
    cfg = make_cfg(tmp_path)
    tokenizer = load_tokenizer(cfg)
    assert len(tokenizer) <= 512 and tokenizer.pad_token is not None
    cfg.model.tokenizer = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="^model.tokenizer: cannot load"):
        load_tokenizer(cfg)
