"""Eval rows are never training rows, whichever declaration brings them (contract/overlap.py): the plan
refuses an overlap in one line naming both sources and a row of each (launcher/resolve/datarules.py),
data.allow_eval_overlap lets it through knowingly (plan line, run.json), and the training refuses it again
on the tokenized cache's row hashes (train/dataset/load.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hub_fixture import build_hub_cache
from tests.launcher.conftest import REPO, rendered_dir, run_cli

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
LOCAL = ["--executor", "local", "--model", "tiny"]
QA = [{"prompt": f"What is {i} + {i}?", "completion": f"It is {2 * i}."} for i in range(30)]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _plan(tmp_path: Path, toml: str, *extra: str):
    (tmp_path / "mix.toml").write_text(toml)
    return run_cli(["plan", *LOCAL, "--data", "mix.toml", *extra], tmp_path)


def test_one_file_declared_twice_with_an_eval_fraction_is_refused(tmp_path: Path) -> None:
    _jsonl(tmp_path / "chat.jsonl", SAMPLE[:40])
    result = _plan(tmp_path, '[[data.sources]]\npath = "chat.jsonl"\nname = "a"\neval_fraction = 0.2\n'
                             '[[data.sources]]\npath = "chat.jsonl"\nname = "b"\n')
    assert result.returncode == 2, result.stdout
    line = result.stderr.strip().splitlines()[-1]
    assert "8 of 8 eval rows are also training rows: eval row " in line and f"{tmp_path / 'chat.jsonl'}:" in line
    assert "of source 'a' is training row" in line and "of source 'b'" in line
    assert "data.allow_eval_overlap = true" in line


def test_an_eval_path_that_is_another_sources_training_file_is_refused(tmp_path: Path) -> None:
    _jsonl(tmp_path / "chat.jsonl", SAMPLE[:20])
    _jsonl(tmp_path / "qa.jsonl", QA)
    fresh = [{"prompt": f"Name {i}.", "completion": "Done."} for i in range(5)]
    _jsonl(tmp_path / "held.jsonl", fresh + QA[:2])  # rows 1 and 2 of qa.jsonl, at lines 6 and 7
    result = _plan(tmp_path, '[[data.sources]]\npath = "chat.jsonl"\neval_path = "held.jsonl"\nformat = "auto"\n'
                             '[[data.sources]]\npath = "qa.jsonl"\n')
    assert result.returncode == 2
    line = result.stderr.strip().splitlines()[-1]
    assert f"2 of 7 eval rows are also training rows: eval row {tmp_path / 'held.jsonl'}:6 of source 'chat'" in line
    assert f"is training row {tmp_path / 'qa.jsonl'}:1 of source 'qa'" in line


def test_hub_slices_that_share_rows_are_refused(tmp_path: Path) -> None:
    chats = [json.loads(line) for line in SAMPLE[:30]]
    build_hub_cache(tmp_path / "hf_home", "sft-test/chats", {"train_sft": chats})
    (tmp_path / "cluster.toml").write_text(
        'default_profile = "cpu"\n[profiles.cpu]\npartition = "cpu"\ngpus_per_node = 0\nprocesses_per_node = 1\n'
        'backend = "gloo"\ntime = "1:00:00"\nsignal_lead_s = 60\nstorage_root = "runs"\n'
        f'hf_home = "{tmp_path / "hf_home"}"\n')
    (tmp_path / "hub.toml").write_text('[[data.sources]]\npath = "sft-test/chats"\nsplit = "train_sft[:20]"\n'
                                       'eval_split = "train_sft[15:]"\n')
    result = run_cli(["plan", "--cluster", "cluster.toml", "--model", "tiny", "--data", "hub.toml"], tmp_path)
    assert result.returncode == 2, result.stdout
    assert ("5 of 15 eval rows are also training rows: eval row sft-test/chats[row 1] of source 'chats' is "
            "training row sft-test/chats[row 16]") in result.stderr


def test_allowed_overlap_is_said_in_the_plan_and_recorded_in_run_json(tmp_path: Path) -> None:
    _jsonl(tmp_path / "chat.jsonl", SAMPLE[:20])
    _jsonl(tmp_path / "other.jsonl", SAMPLE[:20])
    (tmp_path / "mix.toml").write_text('[data]\nallow_eval_overlap = true\n[[data.sources]]\npath = "chat.jsonl"\n'
                                       'eval_path = "other.jsonl"\n')
    result = run_cli([*LOCAL, "--data", "mix.toml", "--dry-run", "--output", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Checked 20 of 20 eval rows are also training rows (allowed: data.allow_eval_overlap = true)" \
        in result.stdout
    record = json.loads((rendered_dir(result) / "run.json").read_text())
    assert record["eval_overlap"]["rows"] == 20


def test_training_refuses_eval_examples_whose_tokens_it_trains_on(tmp_path: Path) -> None:
    from contract.config import TrainConfig
    from contract.schema import ConfigError
    from contract.sources import DataSource
    from train.dataset.load import build_datasets, load_tokenizer

    _jsonl(tmp_path / "chat.jsonl", SAMPLE[:20])
    cfg = TrainConfig()
    cfg.run.dir = str(tmp_path / "run")
    cfg.data.sources = [DataSource(str(tmp_path / "chat.jsonl"), name="a", eval_fraction=0.2),
                        DataSource(str(tmp_path / "chat.jsonl"), name="b")]
    tokenizer = load_tokenizer(cfg)
    with pytest.raises(ConfigError, match=r"4 of 4 eval rows are also training rows: eval row #\d+ \(of its examples\) of "
                                          r"source 'a' is training row #\d+ of source 'b'"):
        build_datasets(cfg, tokenizer)
    cfg.data.allow_eval_overlap = True
    assert len(build_datasets(cfg, tokenizer).eval) == 4
    cfg.data.allow_eval_overlap = False
    cfg.data.sources = [cfg.data.sources[0]]  # one file, 20 distinct rows: 16 train, 4 eval, none shared
    assert len(build_datasets(cfg, tokenizer).eval) == 4
