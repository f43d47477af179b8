"""--help that helps, one-line usage errors, and one call shape for every executor."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

from contract.config import TrainSection
from launcher.cli import COMMANDS
from launcher.execute.executors import EXECUTORS
from tests.launcher.conftest import run_cli


def test_every_training_flag_has_its_fields_description(tmp_path: Path) -> None:
    text = run_cli(["--help"], tmp_path).stdout
    flags = re.sub(r"\s+", " ", text.split("training flags")[1])
    for field in dataclasses.fields(TrainSection):
        doc = field.metadata.get("help", "")
        assert doc, f"TrainSection.{field.name} has no documentation"
        assert re.search(rf"--{field.name} (\S+ ){{1,3}}{re.escape(doc)}", flags), field.name
    for name in COMMANDS:
        assert name in text


@pytest.mark.parametrize("args", [["--nodes", "2"], ["--model", "tiny", "--executor", "bogus"], ["status"],
                                  ["plan", "--model", "tiny", "--nodes", "x"]])
def test_usage_errors_are_one_line_and_point_to_help(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(args, tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("sft-launch: error: ") and line.endswith("--help'") and "usage:" not in result.stderr


@pytest.mark.parametrize("name", sorted(EXECUTORS))
def test_every_executor_has_the_one_call_shape(name: str) -> None:
    module = importlib.import_module(EXECUTORS[name])
    assert list(inspect.signature(module.check).parameters) == ["launch", "rendered"], name
    assert list(inspect.signature(module.start).parameters) == ["launch"], name
