"""A run directory belongs to one job, on the real cluster (issue #32): the same launch while its job
lives is refused in one line; racing launches submit exactly one job; `cancel --now` writes no
checkpoint and `status` then says CANCELLED; the job is checked against the partition's limits before
the queue (`plan` exits 3); with no accounting on this cluster, `status` falls back to scontrol and
run.json (sacct answers "accounting storage is disabled").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.ops import slurm, status
from tests.slurm import slurm_harness as sh

pytestmark = [pytest.mark.slurm]

CLUSTER_TOML = Path(__file__).with_name("cluster.toml")
LONG = ["--cluster", str(CLUSTER_TOML), "--profile", "cpu", "--model", "tiny", "--max_steps", "100000",
        "--logging_steps", "1", "--save_steps", "100000"]


def sft(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def job_ids(run: Path) -> list[str]:
    return json.loads((run / "run.json").read_text())["job_ids"]


def wait_for_steps(run: Path, count: int, timeout: float = 180) -> None:
    def trained() -> bool:
        path = run / "metrics.jsonl"
        return path.exists() and sum('"loss"' in line for line in path.read_text().splitlines()) >= count

    sh.wait_until(trained, timeout, f"{count} training steps in {run}")


def test_duplicate_launch_refused_cancel_now_writes_no_checkpoint_then_resume(tmp_path: Path, slurm_jobs) -> None:
    run = tmp_path / "run"
    first = sft(*LONG, "--output", str(run), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    job = slurm_jobs.track(int(job_ids(run)[-1]))
    refused = sft(*LONG, "--output", str(run), cwd=tmp_path)
    assert refused.returncode == 1 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert f"job {job} is " in refused.stderr and "sft-launch cancel" in refused.stderr
    wait_for_steps(run, 2)
    assert sft(*LONG, "--output", str(run), cwd=tmp_path).returncode == 1  # RUNNING now: still refused
    cancelled = sft("cancel", str(run), "--now", cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert not list((run / "checkpoints").glob("step-*")), "cancel --now wrote a checkpoint"
    assert sh.show_job(job)["JobState"] == "CANCELLED"
    shown = json.loads(sft("status", str(run), "--json", cwd=tmp_path).stdout)
    assert shown["state"] == "CANCELLED" and shown["state_source"] == "slurm"
    assert job_ids(run) == [str(job)]
    resumed = sft(*LONG, "--output", str(run), cwd=tmp_path)  # the job ended: the same command goes on
    assert resumed.returncode == 0, resumed.stderr
    slurm_jobs.track(int(job_ids(run)[-1]))
    assert len(job_ids(run)) == 2
    assert sft("cancel", str(run), "--now", cwd=tmp_path).returncode == 0


def test_racing_launches_submit_exactly_one_job(tmp_path: Path, slurm_jobs) -> None:
    run = tmp_path / "race"
    command = [sys.executable, "-m", "launcher.cli", *LONG, "--output", str(run)]
    procs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [(p.wait(timeout=180), p.stderr.read() if p.stderr else "") for p in procs]
    for job in job_ids(run):
        slurm_jobs.track(int(job))
    assert sorted(code for code, _ in results) == [0, 1, 1], results
    assert len(job_ids(run)) == 1
    job_name = f"sft-{run.name}"
    listed = subprocess.run(["squeue", "-h", "-n", job_name, "-o", "%i"], capture_output=True, text=True, check=True)
    assert listed.stdout.split() == job_ids(run), "exactly one job in the queue under that name"
    assert sft("cancel", str(run), "--now", cwd=tmp_path).returncode == 0


def test_partition_limits_are_checked_before_the_queue(tmp_path: Path) -> None:
    nodes = len(subprocess.run(["sinfo", "-h", "-N", "-p", "cpu", "-o", "%N"], capture_output=True, text=True,
                               check=True).stdout.split())
    base = ["--cluster", str(CLUSTER_TOML), "--profile", "cpu", "--model", "tiny", "--output", str(tmp_path / "r")]
    too_many = sft(*base, "--nodes", str(nodes + 1), cwd=tmp_path)
    assert too_many.returncode == 2, too_many.stderr
    assert f"--nodes {nodes + 1}: partition cpu has {nodes} node(s); the job would pend forever" in too_many.stderr
    assert not (tmp_path / "r").exists()
    plan = sft("plan", *base, "--nodes", str(nodes + 1), cwd=tmp_path)
    assert plan.returncode == 3 and "Cluster partition cpu:" in plan.stdout and "DOES NOT FIT" in plan.stdout
    fits = sft("plan", *base, "--nodes", str(nodes), cwd=tmp_path)
    assert fits.returncode == 0 and f"partition cpu: {nodes} node(s)" in fits.stdout, fits.stdout
    gpus = sft("plan", *base, "--set", "profile.gpus_per_node=1", "--set", "profile.processes_per_node=0",
               "--set", "profile.backend=nccl", "--set", "profile.gpu_type=a100", cwd=tmp_path)
    assert gpus.returncode == 3 and "profile.gpus_per_node = 1: partition cpu has no GPUs" in gpus.stdout, \
        gpus.stdout + gpus.stderr
    subprocess.run(["scontrol", "create", "PartitionName=sftshort", "Nodes=node[1-2]", "MaxTime=10", "MaxNodes=1",
                    "State=UP"], check=True, capture_output=True)
    try:
        short = sft(*base, "--set", "profile.partition=sftshort", "--time", "20", cwd=tmp_path)
        assert short.returncode == 2 and "--time 0-00:20:00: partition sftshort allows at most 0-00:10:00 " \
            "(MaxTime" in short.stderr, short.stderr
        wide = sft(*base, "--set", "profile.partition=sftshort", "--time", "5", "--nodes", "2", cwd=tmp_path)
        assert "partition sftshort allows at most 1 node(s) per job (MaxNodes)" in wide.stderr
    finally:
        subprocess.run(["scontrol", "delete", "PartitionName=sftshort"], capture_output=True)


def test_status_without_accounting_falls_back_to_scontrol_then_run_json(tmp_path: Path, slurm_jobs) -> None:
    job = slurm_jobs.submit_text("#!/bin/bash\nexit 3\n", "-p", "cpu", "-o", str(tmp_path / "out"))
    sh.wait_state(job, "FAILED", timeout=60)
    assert slurm.accounting_fields(str(job)) is None  # AccountingStorageType=accounting_storage/none
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"job_ids": [str(job)], "events": [
        {"event": "finish", "outcome": "failed", "exit_code": 3}]}))
    from_slurm = status.run_status(run)
    assert (from_slurm["state"], from_slurm["state_source"]) == ("FAILED", "slurm")
    forgotten = status.run_status(run, lambda _job: None)  # after MinJobAge: slurmctld has forgotten it
    assert (forgotten["state"], forgotten["state_source"]) == ("FAILED (exit 3)", "run.json")


def test_a_job_slurm_does_not_know_owns_nothing(tmp_path: Path) -> None:
    """squeue -j on ids slurmctld never had (or forgot) says "Invalid job id": not a live job."""
    from launcher.ops.ownership import live_job

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"job_ids": ["999999"]}))
    assert live_job(run) is None
