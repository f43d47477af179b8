"""bench/suites/gpu_parity.py end to end on CPU (--cpu-smoke: tiny shape, 6 steps): corpus, one initial
checkpoint, our default path (and TRL's SFTTrainer where trl is installed) from it, twice (--repeat 2),
the shared eval scorer, the tables, and a results file that tests/bench/test_results_kinds.py's parity checks
accept; then --merge of two such files into one record (and its refusals), without training again."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites.gpu_parity import comparisons
from bench.report.parity_record import side_entry
from bench.report.results_io import write_result
from tests.bench.test_results_kinds import check_parity_record

REPO = Path(__file__).resolve().parents[2]


def _parity(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.suites.gpu_parity", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    tmp = tmp_path_factory.mktemp("parity")
    proc = _parity("--cpu-smoke", "--repeat", "2", "--out", str(tmp / "out"), "--results", str(tmp / "results"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    path = tmp / "results" / "parity-tiny.json"
    return path, json.loads(path.read_text()), proc.stdout


def test_cpu_smoke_trains_each_side_twice_scores_and_writes_a_results_file(smoke) -> None:
    path, record, stdout = smoke
    assert "| side | eval loss (mean) | each repeat | spread | vs |" in stdout
    ours = record["sides"]["ours"]
    assert [run["run"] for run in ours["runs"]] == ["ours", "ours.2"]
    assert (path.parent.parent / "out" / "ours.2" / "metrics.jsonl").is_file()  # each repeat its own run dir
    for run in ours["runs"]:
        assert len(run["losses"]) == record["steps"] == 6 and math.isfinite(run["eval_loss"])
        assert run["eval_loss"] < math.log(2048)  # below uniform over the tiny vocabulary: it learned something
    assert ours["eval_losses"] == [run["eval_loss"] for run in ours["runs"]]
    assert ours["eval_loss"] == pytest.approx(statistics.fmean(ours["eval_losses"]))
    assert record["comparisons"] == comparisons(record["sides"]) and "provenance" in record
    check_parity_record(record, path.name)
    if importlib.util.find_spec("trl") is not None:  # same init, data and schedule: the same eval loss
        (judged,) = record["comparisons"]
        assert judged["side"] == "ours" and judged["reference"] == "trl" and judged["within_target"], judged
        assert judged["repeats"] == judged["reference_repeats"] == 2


def test_merge_pools_the_runs_of_files_of_one_config(smoke, tmp_path: Path) -> None:
    path, record, _ = smoke
    runs = copy.deepcopy(record["sides"]["ours"]["runs"])
    runs[0]["eval_loss"] += 0.5  # as another GPU's file would differ
    sides = {**record["sides"], "ours": side_entry(runs)}
    second = write_result(path.parent.parent / "gpu1" / "parity-tiny.json",  # another GPU's, one name
                          {**record, "sides": sides, "comparisons": comparisons(sides)})
    proc = _parity("--merge", str(path), str(second), "--results", str(tmp_path / "merged"), "--name", "both")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    merged = json.loads((tmp_path / "merged" / "parity-tiny-both.json").read_text())
    ours = merged["sides"]["ours"]
    assert len(ours["runs"]) == 4 and [run["file"] for run in ours["runs"]] == ["results/parity-tiny.json"] * 2 + ["gpu1/parity-tiny.json"] * 2
    assert ours["eval_losses"] == record["sides"]["ours"]["eval_losses"] + sides["ours"]["eval_losses"]
    assert len(merged["merged_from"]) == 2 and all(m["provenance"]["commit"] for m in merged["merged_from"])
    check_parity_record(merged, "merged")
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| ours |")]
    assert ", ".join(f"{v:.4f}" for v in ours["eval_losses"]) in row and "%" in row, row  # each repeat, the spread


def test_merge_refuses_files_of_another_config_or_named_twice(smoke, tmp_path: Path) -> None:
    path, record, _ = smoke
    steps = write_result(tmp_path / "parity-tiny.json", {**record, "steps": 7})
    proc = _parity("--merge", str(path), str(steps), "--results", str(tmp_path))
    assert proc.returncode == 2 and "steps = 7" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    proc = _parity("--merge", str(path), str(path), "--results", str(tmp_path))
    assert proc.returncode == 2 and "named twice" in proc.stderr, proc.stderr
    assert not (tmp_path / "parity-tiny-merged.json").exists()


def test_every_fp8_side_sets_only_keys_the_training_config_has() -> None:
    """The FP8 sides (recipes, fp32 accumulation) are train.toml settings a typo would otherwise turn into a
    config error on the GPU machine."""
    import dataclasses

    from bench.suites.gpu_parity import FP8_SIDES, side_overrides
    from contract.config import TrainSection

    keys = {field.name for field in dataclasses.fields(TrainSection)}
    for side in FP8_SIDES:
        train = side_overrides(side)["train"]
        assert train["precision"] == "fp8" and set(train) <= keys, side
    assert side_overrides("ours-fp8-fullacc")["train"]["fp8_fast_accum"] is False
    assert side_overrides("ours-fp8")["train"]["fp8_fast_accum"] is True  # what its files of 2026-11-26/27 ran
