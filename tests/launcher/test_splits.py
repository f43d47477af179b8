"""Which files a folder or a file's neighbours hold for each split (contract/readers.py's documented rules),
the plan naming the files it read, and hidden files skipped at any depth and counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.datacheck import LocalData, check_data
from contract.readers import data_files, split_of
from contract.schema import ConfigError
from tests.launcher.conftest import REPO, run_cli

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("name", "split"), [
    ("train.jsonl", "train"), ("chats_train.jsonl", "train"), ("chats_test.jsonl", "test"),
    ("train_synthetic.jsonl", "train"), ("dev-01.jsonl", "dev"), ("train_sft-00000-of-00002.parquet", "train_sft"),
    ("validation/part-0.jsonl", "validation"), ("eval_set/x.jsonl", "eval"), ("part-00001.jsonl", None),
    ("interval.jsonl", None), ("data.jsonl", None)])
def test_a_files_name_says_its_split_by_the_documented_rules(name: str, split: str | None) -> None:
    assert split_of(Path(name)) == split


def test_the_split_asked_for_is_a_name_of_its_own() -> None:
    assert split_of(Path("train_sft.jsonl"), "train_sft") == "train_sft"
    assert split_of(Path("train_sft.jsonl")) == "train"
    with pytest.raises(ConfigError, match=r"train_test.jsonl: its name holds two split words \(train, test\)"):
        split_of(Path("train_test.jsonl"))


def test_prefixed_and_suffixed_split_names_go_to_their_split(tmp_path: Path) -> None:
    folder = tmp_path / "chats"
    _write(folder / "chats_train.jsonl", SAMPLE[:10])
    _write(folder / "chats_test.jsonl", SAMPLE[10:14])
    assert data_files(folder) == [folder / "chats_train.jsonl"]
    assert data_files(folder, "test") == [folder / "chats_test.jsonl"]
    _write(folder / "train_synthetic.jsonl", SAMPLE[20:25])
    assert data_files(folder) == [folder / "chats_train.jsonl", folder / "train_synthetic.jsonl"]
    _write(folder / "notes.jsonl", SAMPLE[30:31])
    with pytest.raises(ConfigError, match="notes.jsonl: its name says no split, while its folder's other files do"):
        data_files(folder)


def test_hidden_files_and_folders_are_skipped_at_any_depth_and_counted(tmp_path: Path) -> None:
    folder = tmp_path / "shards"
    _write(folder / "part-1.jsonl", SAMPLE[:10])
    _write(folder / "sub" / "part-2.jsonl", SAMPLE[10:20])
    _write(folder / ".ipynb_checkpoints" / "part-1-checkpoint.jsonl", SAMPLE[:20])
    _write(folder / "sub" / ".cache" / "x.jsonl", SAMPLE[:3])
    _write(folder / ".part-3.jsonl", SAMPLE[:3])
    check = check_data(LocalData(folder))
    assert (check.rows, check.hidden, check.files) == (20, 3, ["part-1.jsonl", "sub/part-2.jsonl"])
    assert "20 rows checked (sharegpt)" in check.describe(False)
    assert check.describe(False).endswith("; read part-1.jsonl, sub/part-2.jsonl; 3 hidden files skipped")


def test_the_plan_lists_the_files_of_each_split(tmp_path: Path) -> None:
    _write(tmp_path / "chats" / "chats_train.jsonl", SAMPLE[:30])
    _write(tmp_path / "chats" / "chats_test.jsonl", SAMPLE[100:110])
    (tmp_path / "mix.toml").write_text('[[data.sources]]\npath = "chats"\neval_split = "test"\n')
    result = run_cli(["plan", "--executor", "local", "--model", "tiny", "--data", "mix.toml"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("Checked ")]
    assert lines[0].startswith("Checked chats: 30 rows checked (sharegpt)")
    assert lines[0].endswith("; read chats_train.jsonl")
    assert lines[1].startswith("Checked chats (eval): 10 rows") and lines[1].endswith("; read chats_test.jsonl")
