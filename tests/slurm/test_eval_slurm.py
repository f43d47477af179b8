"""`sft-launch eval` as a real SLURM job on the local 2-node cluster: the CLI renders RUN/eval/<name>.slurm,
sbatch-submits it on the `cpu` profile, the job runs the real lm-eval (HF backend, CPU) on a tiny
export with custom YAML + JSONL tasks, and the results file is parsed and checked; the task `heldout`
on a 2-source run reads the run's train.toml and data on the node and reports each source's loss."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.eval_helpers import make_run, offline_env, save_tiny_export, sft_launch, write_tasks
from tests.slurm import slurm_harness as sh
from tests.train.run_helpers import read_log, run_training, write_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("lm_eval", reason="the eval extra (pip install 'sft-launch[eval]') is not installed")

CLUSTER_TOML = Path(__file__).parent / "cluster.toml"
JOB_TIMEOUT_S = 300


def scratch(prefix: str) -> Path:
    # Not pytest's tmp_path: concurrent pytest sessions prune each other's base dirs (as test_e2e_train).
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("SFT_SLURM_DIR", "/tmp")))


def submit_eval(run_dir: Path, tasks: Path, name: str, *flags: str) -> int:
    proc = sft_launch(["eval", str(run_dir), "--cluster", str(CLUSTER_TOML), "--profile", "cpu", "--include-path",
                       str(tasks), "--batch-size", "2", "--name", name, "--time", "10", *flags], run_dir.parent,
                      offline_env(run_dir.parent), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return int(re.search(r"submitted eval job (\d+)", proc.stdout)[1])


def wait_completed(slurm_jobs, run_dir: Path, name: str, job_id: int) -> str:
    job = sh.wait_all_finished([slurm_jobs.track(job_id)], JOB_TIMEOUT_S)[job_id]
    log = run_dir / "logs" / f"eval-{name}-{job_id}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    assert job["JobState"] == "COMPLETED", text[-3000:] or job
    return text


def test_eval_job_on_the_cluster_writes_the_results_file(slurm_jobs) -> None:
    root = scratch("sft-eval-")
    run_dir, tasks = make_run(root), write_tasks(root / "tasks")
    job_id = submit_eval(run_dir, tasks, "on-slurm", "--tasks", "tiny_mc,tiny_gen", "--limit", "4")
    log = wait_completed(slurm_jobs, run_dir, "on-slurm", job_id)
    assert (run_dir / "eval" / "on-slurm.slurm").is_file() and "sft-launch eval: results:" in log
    ours = [line for line in log.splitlines() if line.startswith("sft-launch eval: ")]
    assert len(ours) == len(set(ours)) and "fatal: not a git repository" not in log, log[-3000:]  # each line once

    data = json.loads((run_dir / "eval" / "on-slurm.json").read_text())
    assert set(data["results"]) == {"tiny_mc", "tiny_gen"}
    assert data["versions"] == {"tiny_mc": 1.0, "tiny_gen": 2.0} and data["n-shot"] == {"tiny_mc": 0, "tiny_gen": 0}
    assert data["n-samples"]["tiny_gen"]["effective"] == 4
    assert 0.0 <= data["results"]["tiny_mc"]["acc,none"] <= 1.0
    assert data["settings"]["limit"] == 4 and data["settings"]["tasks"] == ["tiny_mc", "tiny_gen"]
    status = sft_launch(["status", str(run_dir)], root, offline_env(root), timeout=60)
    assert "eval         on-slurm" in status.stdout and "tiny_gen" in status.stdout
    shutil.rmtree(root, ignore_errors=True)


def test_eval_job_exports_the_chosen_checkpoint_first(slurm_jobs) -> None:
    root = scratch("sft-eval-ckpt-")
    run_dir = write_run(root / "run", {"train": {"max_steps": 4, "save_steps": 2, "save_total_limit": 3}})
    assert run_training(run_dir) == 0, read_log(run_dir)[-3000:]
    job_id = submit_eval(run_dir, write_tasks(root / "tasks"), "ckpt", "--tasks", "tiny_mc", "--limit", "2",
                         "--checkpoint", "2")
    log = wait_completed(slurm_jobs, run_dir, "ckpt", job_id)
    assert "exported" in log and (run_dir / "eval" / "export-step-00000002" / "model.safetensors").is_file()
    data = json.loads((run_dir / "eval" / "ckpt.json").read_text())
    assert data["model"] == str(run_dir / "eval" / "export-step-00000002") and "tiny_mc" in data["results"]
    shutil.rmtree(root, ignore_errors=True)


def test_eval_job_reports_the_heldout_loss_per_source(slurm_jobs) -> None:
    from tests.launcher.conftest import write_run as render_run

    root = scratch("sft-eval-heldout-")
    sample = Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl"
    (root / "qa.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "completion": str(2 * i)})
                                           + "\n" for i in range(40)))
    (root / "mix.toml").write_text(f'[[data.sources]]\npath = "{sample}"\nname = "chat"\neval_fraction = 0.1\n'
                                   f'[[data.sources]]\npath = "{root / "qa.jsonl"}"\nname = "qa"\n'
                                   'format = "prompt_completion"\neval_fraction = 0.25\n')
    run_dir = render_run(["--executor", "local", "--model", "tiny", "--data", str(root / "mix.toml"),
                          "--output", str(root / "run")])
    save_tiny_export(run_dir / "export")
    job_id = submit_eval(run_dir, write_tasks(root / "tasks"), "ho", "--tasks", "heldout")
    log = wait_completed(slurm_jobs, run_dir, "ho", job_id)
    assert "held-out loss of qa: 10 examples" in log and "sft-launch eval: results:" in log
    heldout = json.loads((run_dir / "eval" / "ho.json").read_text())["heldout"]
    # 30 of the sample held out, 10 of which duplicate trained rows and are trained (contract/overlap.py)
    assert [(row["name"], row["examples"]) for row in heldout["sources"]] == [("chat", 20), ("qa", 10)]
    assert all(0 < row["loss"] < 20 and row["tokens"] > 0 for row in heldout["sources"])
    assert set(heldout["metrics"]) == {"eval_loss", "eval_loss/chat", "eval_loss/qa"}
    shutil.rmtree(root, ignore_errors=True)
