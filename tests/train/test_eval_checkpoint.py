"""`sft-launch eval RUN --checkpoint STEP`: a real 2-rank CPU training run checkpoints, the chosen
checkpoint is exported first (train/export_checkpoint.py under `accelerate launch`), then evaluated
with the real lm-eval; the export holds exactly the checkpoint's weights and is reused next time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.eval_helpers import offline_env, sft_launch, write_tasks
from tests.train.run_helpers import full_model_state, read_log, run_training, write_run

pytestmark = pytest.mark.slow
pytest.importorskip("lm_eval", reason="the eval extra (pip install 'sft-launch[eval]') is not installed")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-rank run with one complete checkpoint, checkpoints/step-00000002."""
    run_dir = write_run(tmp_path_factory.mktemp("ckpt") / "run",
                        {"train": {"max_steps": 4, "save_steps": 2, "save_total_limit": 3}})
    assert run_training(run_dir) == 0, read_log(run_dir)[-3000:]
    return run_dir


def test_eval_of_a_checkpoint_exports_it_first(trained: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    run_dir = trained
    tasks = write_tasks(tmp_path / "tasks")
    env = offline_env(tmp_path)
    flags = ["--executor", "local", "--tasks", "tiny_mc", "--include-path", str(tasks), "--limit", "2"]

    missing = sft_launch(["eval", str(run_dir), "--checkpoint", "3", *flags], tmp_path, env, timeout=60)
    assert missing.returncode == 2 and "--checkpoint 3" in missing.stderr and "complete: 2" in missing.stderr

    proc = sft_launch(["eval", str(run_dir), "--checkpoint", "2", "--name", "step2", *flags], tmp_path, env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    export = run_dir / "eval" / "export-step-00000002"
    exported = load_file(export / "model.safetensors")
    saved = full_model_state(run_dir / "checkpoints" / "step-00000002")  # FSDP2 on CPU: sharded (DCP)
    assert exported.keys() == saved.keys() and all((exported[k] == saved[k]).all() for k in saved)
    assert (export / "chat_template.jinja").is_file() and not list(export.parent.glob(".tmp-*"))
    data = json.loads((run_dir / "eval" / "step2.json").read_text())
    assert data["model"] == str(export) and set(data["results"]) == {"tiny_mc"}

    again = sft_launch(["eval", str(run_dir), "--checkpoint", "latest", "--dry-run", *flags], tmp_path, env, timeout=60)
    assert again.returncode == 0 and "export_checkpoint" not in again.stdout  # already exported: reused
    assert str(export) in again.stdout


def test_every_checkpoint_pins_exports_and_evaluates_each_then_stops(trained: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir, ignore=shutil.ignore_patterns("eval"))  # train.toml: dir = "."
    tasks = write_tasks(tmp_path / "tasks")
    proc = sft_launch(["eval", str(run_dir), "--every-checkpoint", "--executor", "local", "--tasks", "tiny_mc",
                       "--include-path", str(tasks), "--limit", "2", "--name", "watch"], tmp_path, offline_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--remove-checkpoint" in proc.stdout and "the run has finished" in proc.stdout
    data = json.loads((run_dir / "eval" / "watch-step-00000002.json").read_text())
    assert data["model"] == str(run_dir / "eval" / "export-step-00000002")
    assert not list((run_dir / "eval").glob("*pinned-step-*"))  # the pinned copy is gone after its export
    assert (run_dir / "checkpoints" / "step-00000002" / "COMPLETE").is_file()  # the checkpoint itself is not
