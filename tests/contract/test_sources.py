"""The mixture's arithmetic and the source settings (contract/sources.py): torch-free."""

from __future__ import annotations

import tomllib

import pytest

from contract.config import TrainConfig
from contract.schema import ConfigError, build
from contract.sources import DataSource, Mixture, default_name, epoch_examples, looks_like_hub_id, parse_data_flag


def test_one_plain_source_is_every_example_once_in_order() -> None:
    mixture = Mixture((5,), (epoch_examples(DataSource("a.jsonl"), 5),))
    assert mixture.is_plain and mixture.select(seed=1, epoch=3) == [0, 1, 2, 3, 4]


def test_weights_and_samples_set_each_sources_share_of_an_epoch() -> None:
    sources = [DataSource("a", weight=0.3), DataSource("b", weight=2.5), DataSource("c", samples=7)]
    takes = tuple(epoch_examples(s, n) for s, n in zip(sources, (10, 4, 100)))
    assert takes == (3, 10, 7)
    chosen = Mixture((10, 4, 100), takes).select(seed=42, epoch=0)
    assert sum(i < 10 for i in chosen) == 3
    b = [i for i in chosen if 10 <= i < 14]  # two whole passes plus a seeded half
    assert len(b) == 10 and all(b.count(i) in (2, 3) for i in range(10, 14))
    assert len([i for i in chosen if i >= 14]) == 7 and len(set(i for i in chosen if i >= 14)) == 7


def test_the_draw_is_seeded_and_new_each_epoch() -> None:
    mixture = Mixture((1000, 50), (300, 50))
    first = mixture.select(seed=7, epoch=0)
    assert first == mixture.select(seed=7, epoch=0)  # deterministic: every rank, every restart
    assert first != mixture.select(seed=7, epoch=1)  # another 30% next epoch
    assert first != mixture.select(seed=8, epoch=0)
    assert first[-50:] == list(range(1000, 1050))  # weight 1: all of the second source


def test_cli_weight_suffix() -> None:
    assert parse_data_flag("code.parquet:0.3") == ("code.parquet", 0.3)
    assert parse_data_flag("HuggingFaceH4/ultrachat_200k") == ("HuggingFaceH4/ultrachat_200k", None)
    assert parse_data_flag("org/name:2") == ("org/name", 2.0)
    for bad in ("a.jsonl:0", "a.jsonl:-1"):
        with pytest.raises(ConfigError, match="weight must be > 0"):
            parse_data_flag(bad)


def _config(text: str) -> TrainConfig:
    return build(TrainConfig, tomllib.loads(text))


@pytest.mark.parametrize(("value", "hub"), [
    ("org/name", True), ("name", True), ("Org-1/data_set.v2", True),  # hub repo ids
    ("a/b/c", False), ("./org/name", False), ("/abs/name", False), ("~/name", False),  # only paths
    ("org/chats.jsonl", False), ("notes.txt", False), ("DATA.JSONL", False), ("org/name.csv", False),  # files
    ("org/-name", False), ("org name", False), ("", False),  # not repo ids
])
def test_one_rule_tells_a_hub_id(value: str, hub: bool) -> None:
    assert looks_like_hub_id(value) is hub


def test_a_path_that_exists_is_never_a_hub_id(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").write_text("{}\n")  # a relative path with a slash, shaped like a hub id
    assert not looks_like_hub_id("org/name") and looks_like_hub_id("org/other")


def test_sources_table_validates_with_dotted_keys() -> None:
    cfg = _config('[[data.sources]]\npath = "qa.csv"\nformat = "prompt_completion"\n'
                  'columns = {prompt = "question", completion = "answer"}\nweight = 0.5\n'
                  '[[data.sources]]\npath = "org/chat"\nsplit = "train_sft"\neval_split = "test_sft"\n')
    assert [s.label for s in cfg.data.source_list()] == ["qa", "chat"]
    cases = {
        '[[data.sources]]\npath = "a.jsonl"\nweight = 0': "data.sources[0].weight: must be > 0",
        '[[data.sources]]\npath = "a.jsonl"\n[[data.sources]]\npath = "b/a.jsonl"': "data.sources[1].name: 'a'",
        '[[data.sources]]\npath = "a"\nformat = "alpaca"\ncolumns = {prompt = "q"}': "data.sources[0].columns",
        '[[data.sources]]\npath = "a"\nroles = {bot = "robot"}': "data.sources[0].roles",
        '[[data.sources]]\npath = "a"\neval_fraction = 0.1\neval_path = "b"': "data.sources[0].eval_fraction",
        '[data]\npath = "x"\n[[data.sources]]\npath = "a"': "data.path: set per source",
        '[[data.sources]]\npath = "a"\nname = "a b"': "data.sources[0].name",
        '[[data.sources]]\npath = "a"\neval_split = "train"': "data.sources[0].eval_split: 'train' is also the training",
        '[[data.sources]]\npath = "/d/a.jsonl"\neval_path = "/d/../d/a.jsonl"': "data.sources[0].eval_path: is the training",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            _config(text)


def test_one_path_is_one_source_with_the_sections_settings() -> None:
    cfg = _config('[data]\npath = "/d/chat.jsonl"\nformat = "sharegpt"\neval_fraction = 0.1\n')
    (source,) = cfg.data.source_list()
    assert (source.path, source.format, source.eval_fraction, source.weight) == ("/d/chat.jsonl", "sharegpt", 0.1, 1.0)
    assert cfg.data.key(0, "path") == "data.path"


def test_a_sources_default_name_skips_names_that_say_nothing() -> None:
    """Two hub snapshots' `data` folders are two sources, not two called `data`."""
    assert [default_name(p) for p in ("/x/ultrachat_200k/data", "/y/orca/data/", "/z/gsm8k/main/train-00000-of-00001.parquet",
                                      "chat.jsonl", "org/name", "/d/test.jsonl")] == \
        ["ultrachat_200k", "orca", "main", "chat", "name", "test"]
