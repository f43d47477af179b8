"""`sft-launch eval RUN --tasks heldout`: each source's eval loss on the export, from the run's own
train.toml and eval splits. A real 2-rank CPU training run on a 2-source mixture (a chat file with a
held-out fraction, a Parquet Q&A set with its own CSV eval data) ends with an eval of its final
weights; the held-out task on the export (one process, train/engine/heldout.py) gives the same
per-source losses, and `status` / `runs` show them. No lm-eval needed for this task."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.eval_helpers import offline_env, sft_launch
from tests.train.run_helpers import metrics, read_log, run_training, write_run
from tests.train.test_sources_resume import mixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-rank mixture run whose only eval is the final one (at its last step, on the exported weights)."""
    root = tmp_path_factory.mktemp("heldout")
    config = mixture(root)
    config["train"] = {"max_steps": 4, "eval_steps": 0}
    run_dir = write_run(root / "run", config)
    assert run_training(run_dir) == 0, read_log(run_dir)[-3000:]
    return run_dir


def test_heldout_on_the_export_equals_the_trainings_last_eval_per_source(trained: Path, tmp_path: Path) -> None:
    env = offline_env(tmp_path)
    proc = sft_launch(["eval", str(trained), "--executor", "local", "--tasks", "heldout", "--name", "ho"], tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = [r for r in metrics(trained) if "eval_loss" in r][-1]
    assert last["step"] == 4 and {"eval_loss/chat", "eval_loss/qa"} <= set(last)

    heldout = json.loads((trained / "eval" / "ho.json").read_text())["heldout"]
    assert heldout["train_config"] == str(trained / "train.toml")
    assert set(heldout["metrics"]) == {"eval_loss", "eval_loss/chat", "eval_loss/qa"}
    for key, value in heldout["metrics"].items():
        assert heldout["metrics"][key] == pytest.approx(last[key], rel=1e-5), key
    rows = {row["name"]: row for row in heldout["sources"]}
    assert list(rows) == ["chat", "qa"]
    # 10% of 300 rows held out, less the 15 that duplicate trained rows (trained); the CSV's 10
    assert rows["chat"]["examples"] == 15 and rows["qa"]["examples"] == 10
    for name, row in rows.items():
        assert row["loss"] == pytest.approx(last[f"eval_loss/{name}"], rel=1e-5)
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"])) and row["tokens"] > row["examples"]
    assert heldout["all"]["tokens"] == rows["chat"]["tokens"] + rows["qa"]["tokens"]
    assert heldout["all"]["loss"] == pytest.approx(last["eval_loss"], rel=1e-5)
    assert "lm_eval_version" not in json.loads((trained / "eval" / "ho.json").read_text())["settings"]

    table = proc.stdout[proc.stdout.index("\n  heldout ") + 1:]
    assert [line.split()[0] for line in table.splitlines()[:4]] == ["heldout", "chat", "qa", "all"]
    status = sft_launch(["status", str(trained)], tmp_path, env, timeout=60)
    assert status.returncode == 0 and "eval         ho" in status.stdout and "perplexity" in status.stdout
    listing = sft_launch(["runs", "--root", str(trained.parent)], tmp_path, env, timeout=60)
    assert f"heldout loss {heldout['all']['loss']:.3f}" in listing.stdout


def test_heldout_is_the_default_beside_leaderboard_when_the_run_has_eval_splits(trained: Path, tmp_path: Path) -> None:
    proc = sft_launch(["eval", str(trained), "--executor", "local", "--dry-run"], tmp_path, offline_env(tmp_path),
                      timeout=60)
    if "lm-eval is not installed" in proc.stderr:
        pytest.skip("the default also runs lm-eval's leaderboard, whose extra is not installed")
    assert proc.returncode == 0, proc.stderr
    assert "--tasks heldout,leaderboard" in proc.stdout
    assert f"--train-config {trained / 'train.toml'}" in proc.stdout


def test_heldout_and_lm_eval_tasks_in_one_evaluation(trained: Path, tmp_path: Path) -> None:
    pytest.importorskip("lm_eval", reason="the eval extra (pip install 'sft-launch[eval]') is not installed")
    from tests.eval_helpers import write_tasks

    tasks = write_tasks(tmp_path / "tasks")
    proc = sft_launch(["eval", str(trained), "--executor", "local", "--tasks", "tiny_mc,heldout", "--include-path",
                       str(tasks), "--limit", "2", "--name", "both"], tmp_path, offline_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((trained / "eval" / "both.json").read_text())
    assert set(data["results"]) == {"tiny_mc"} and data["settings"]["tasks"] == ["heldout", "tiny_mc"]
    assert [row["name"] for row in data["heldout"]["sources"]] == ["chat", "qa"]
    lines = proc.stdout[proc.stdout.index("\n  heldout ") + 1:].splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["heldout", "chat", "qa", "all", "tiny_mc"]
