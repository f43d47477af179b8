"""`sft-launch eval` as a real SLURM job on the local 2-node cluster: the CLI renders RUN/eval/<name>.slurm,
sbatch-submits it on the `cpu` profile, the job runs the real lm-eval (HF backend, CPU) on a tiny
export with custom YAML + JSONL tasks, and the results file is parsed and checked."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.eval_helpers import make_run, offline_env, sft_launch, write_tasks
from tests.slurm import slurm_harness as sh

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("lm_eval", reason="the eval extra (pip install 'sft-launch[eval]') is not installed")

CLUSTER_TOML = Path(__file__).parent / "cluster.toml"
JOB_TIMEOUT_S = 300


def test_eval_job_on_the_cluster_writes_the_results_file(slurm_jobs) -> None:
    # Not pytest's tmp_path: concurrent pytest sessions prune each other's base dirs (as test_e2e_train).
    root = Path(tempfile.mkdtemp(prefix="sft-eval-", dir=os.environ.get("SFT_SLURM_DIR", "/tmp")))
    run_dir, tasks = make_run(root), write_tasks(root / "tasks")
    env = offline_env(root)
    proc = sft_launch(["eval", str(run_dir), "--cluster", str(CLUSTER_TOML), "--profile", "cpu", "--tasks",
                       "tiny_mc,tiny_gen", "--include-path", str(tasks), "--limit", "4", "--batch-size", "2",
                       "--name", "on-slurm", "--time", "10"], root, env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = slurm_jobs.track(int(re.search(r"submitted eval job (\d+)", proc.stdout)[1]))
    job = sh.wait_all_finished([job_id], JOB_TIMEOUT_S)[job_id]
    log = run_dir / "logs" / f"eval-on-slurm-{job_id}.log"
    assert job["JobState"] == "COMPLETED", log.read_text(errors="replace")[-3000:] if log.exists() else job
    assert (run_dir / "eval" / "on-slurm.slurm").is_file()

    data = json.loads((run_dir / "eval" / "on-slurm.json").read_text())
    assert set(data["results"]) == {"tiny_mc", "tiny_gen"}
    assert data["versions"] == {"tiny_mc": 1.0, "tiny_gen": 2.0} and data["n-shot"] == {"tiny_mc": 0, "tiny_gen": 0}
    assert data["n-samples"]["tiny_gen"]["effective"] == 4
    assert 0.0 <= data["results"]["tiny_mc"]["acc,none"] <= 1.0
    assert data["settings"]["limit"] == 4 and data["settings"]["tasks"] == ["tiny_mc", "tiny_gen"]
    assert "sft-launch eval: results:" in log.read_text(errors="replace")
    status = sft_launch(["status", str(run_dir)], root, env, timeout=60)
    assert "eval         on-slurm" in status.stdout and "tiny_gen" in status.stdout
    shutil.rmtree(root, ignore_errors=True)
