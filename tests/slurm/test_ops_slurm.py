"""Run operations on the real 2-node cluster: status through a requeue, `logs -f` across a restart,
`cancel` with a final checkpoint, the submitit executor preempted (USR1 through submitit's own
signal path) and resumed to completion, and the Python API (launcher.api: submit, status, cancel,
wait) with `sft-launch runs` listing its run while it trains.

The four runs are submitted together and driven by one loop (two cores: one after the other would
take four times as long); each test then asserts on one run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher import api
from tests.slurm import slurm_harness as sh

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).parent
CLUSTER_TOML = HERE / "cluster.toml"
SUITE_TIMEOUT_S = 420
ENV = {**os.environ, "SFT_SLURM_TESTS": str(HERE)}


def sft(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sft-launch", *args], capture_output=True, text=True, env=ENV, timeout=timeout)


def steps_of_restart(run_dir: Path, restart: int) -> list[int]:
    path = run_dir / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in record and record.get("restart", 0) == restart:
            steps.append(record["step"])
    return steps


@dataclass
class Run:
    name: str
    dir: Path
    job_id: int
    acted: bool = False
    mid_status: dict = field(default_factory=dict)  # `status --json` taken after the requeue
    follower: subprocess.Popen | None = None  # `sft-launch logs -f`
    canceller: subprocess.Popen | None = None  # `sft-launch cancel` (the API's cancel for "api")
    job: dict[str, str] = field(default_factory=dict)
    listing: str = ""  # `sft-launch runs` while this run trains


def launch(root: Path, name: str, *flags: str) -> Run:
    run_dir = root / name
    proc = sft("--cluster", str(CLUSTER_TOML), "--profile", "cpu", "--nodes", "2", "--model", "tiny",
               "--output", str(run_dir), "--logging_steps", "1", "--save_steps", "10", *flags)
    assert proc.returncode == 0, proc.stderr
    return Run(name, run_dir, int(json.loads((run_dir / "run.json").read_text())["job_ids"][-1]))


# The API's cancel in a process of its own (it blocks until the final checkpoint), printing its result.
API_CANCEL = "import json, sys; from launcher.api import attach; print(json.dumps(attach(sys.argv[1]).cancel(wait_s=120)))"


def submit_with_api(root: Path) -> Run:
    handle = api.submit("tiny", nodes=2, cluster=str(CLUSTER_TOML), profile="cpu", executor="sbatch",
                        output=str(root / "api"), logging_steps=1, save_steps=10, max_steps=2000)
    assert handle.run_dir == root / "api" and handle.job_id is not None
    return Run("api", handle.run_dir, int(handle.job_id))


def act(run: Run) -> None:
    """One step of the driver for one run: preempt / cancel once it trains, note mid-run status."""
    if not run.acted and len(steps_of_restart(run.dir, 0)) >= 3:
        run.acted = True
        if run.name == "api":
            run.mid_status = api.attach(run.dir).status()
            run.listing = sft("runs", "--root", str(run.dir.parent)).stdout
            run.canceller = subprocess.Popen([sys.executable, "-c", API_CANCEL, str(run.dir)], env=ENV,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        elif run.name == "requeue":
            sh.signal_batch(run.job_id)  # the batch shell's trap: preemption
        elif run.name == "submitit":
            subprocess.run(["scancel", "--signal=USR1", str(run.job_id)], check=True)  # submitit's path
        else:
            run.canceller = subprocess.Popen(["sft-launch", "cancel", str(run.dir), "--wait", "120"], env=ENV,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.name == "requeue" and not run.mid_status and steps_of_restart(run.dir, 1):
        run.mid_status = json.loads(sft("status", str(run.dir), "--json").stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    sh.require_cluster()
    root = tmp_path_factory.mktemp("ops")
    started = [launch(root, "requeue", "--max_steps", "30"),
               launch(root, "cancel", "--max_steps", "2000"),
               launch(root, "submitit", "--max_steps", "30", "--executor", "submitit"),
               submit_with_api(root)]
    started[0].follower = subprocess.Popen(["sft-launch", "logs", "-f", str(started[0].dir)], env=ENV,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + SUITE_TIMEOUT_S
    pending = {run.job_id: run for run in started}
    state_polls = sh.PollThrottle()
    try:
        while pending:
            assert time.monotonic() < deadline, f"still running after {SUITE_TIMEOUT_S} s: {sorted(pending)}"
            poll = state_polls.due()  # job states at most once per sh.STATE_POLL_S, actions every tick
            for run in list(pending.values()):
                act(run)
                fields = sh.show_job(run.job_id) if poll else {}
                if fields.get("JobState") in sh.FINISHED_STATES and (run.canceller is None
                                                                     or run.canceller.poll() is not None):
                    run.job = fields
                    del pending[run.job_id]
            time.sleep(0.2)
    finally:
        for run in pending.values():
            sh.cancel(run.job_id)
    return {run.name: run for run in started}


def test_status_through_a_requeue(runs: dict[str, Run]) -> None:
    run = runs["requeue"]
    assert run.job["JobState"] == "COMPLETED", run.job
    mid = run.mid_status
    assert mid["state"] in ("RUNNING", "COMPLETING") and mid["job_ids"] == [str(run.job_id)]
    assert (mid["restarts"], mid["preemptions"], mid["timeouts"]) == (1, 1, 0)
    assert mid["total_steps"] == 30 and mid["step"] is not None and mid["last_checkpoint"] is not None
    final = json.loads(sft("status", str(run.dir), "--json").stdout)
    assert final["state"] == "COMPLETED" and final["step"] == 30 and final["done"]
    assert final["slurm_restarts"] == 1
    text = sft("status", str(run.dir)).stdout
    assert "COMPLETED" in text and "preemptions 1" in text and "30/30" in text


def test_logs_follow_across_the_restart_and_end_with_the_job(runs: dict[str, Run]) -> None:
    run = runs["requeue"]
    out, err = run.follower.communicate(timeout=30)  # it must end by itself once the job is over
    assert run.follower.returncode == 0, err
    job = run.job_id
    assert f"job {job} restart 0" in out and f"==> {job}-r1.log (job {job} restart 1) <==" in out
    assert out.index("stop requested") < out.index(f"job {job} restart 1") < out.index("step 30/30")
    node1 = sft("logs", str(run.dir), "--restart", "0", "--node", "1").stdout.splitlines()
    assert node1 and all("[rank 1]" in line or "task 1" in line for line in node1)


def test_cancel_with_a_final_checkpoint(runs: dict[str, Run]) -> None:
    run = runs["cancel"]
    output = run.canceller.stdout.read()
    assert run.canceller.returncode == 0, output
    assert run.job["JobState"] == "CANCELLED", run.job
    assert "final checkpoint step" in output, output
    step = int(output.split("final checkpoint step ")[1].split()[0])
    assert (run.dir / "checkpoints" / f"step-{step:08d}" / "COMPLETE").is_file()
    events = json.loads((run.dir / "run.json").read_text())["events"]
    assert [e["event"] for e in events if e["event"].startswith("cancel")] == ["cancel_requested", "cancel"]
    assert not (run.dir / "CANCEL_REQUESTED").exists()
    assert json.loads(sft("status", str(run.dir), "--json").stdout)["state"] == "CANCELLED"


def test_submitit_executor_preempted_and_resumed(runs: dict[str, Run]) -> None:
    run = runs["submitit"]
    assert run.job["JobState"] == "COMPLETED", run.job
    assert run.job.get("Restarts") == "1"
    first, second = steps_of_restart(run.dir, 0), steps_of_restart(run.dir, 1)
    assert first and second and second[-1] == 30
    assert second[0] <= first[-1] + 1  # resumed from the stop-save, not from scratch
    events = [e for e in json.loads((run.dir / "run.json").read_text())["events"]]
    assert [(e["event"], e.get("kind")) for e in events] == [("start", None), ("requeue", "preemption"),
                                                               ("start", None), ("finish", None)]
    assert events[-1]["exit_code"] == 0
    assert (run.dir / "logs" / f"{run.job_id}-r0.log").is_file() and (run.dir / "logs" / f"{run.job_id}-r1.log").is_file()
    assert json.loads(sft("status", str(run.dir), "--json").stdout)["state"] == "COMPLETED"


def test_python_api_submit_status_cancel_wait_and_runs_listing(runs: dict[str, Run]) -> None:
    run = runs["api"]
    handle = api.attach(run.dir)
    assert run.mid_status["state"] == "RUNNING" and run.mid_status["job_ids"] == [str(run.job_id)], run.mid_status
    assert run.mid_status["step"] is not None and run.mid_status["total_steps"] == 2000
    line = next((line for line in run.listing.splitlines() if line.startswith("api ")), "")
    assert "RUNNING" in line and "/2000" in line, run.listing  # `sft-launch runs` with the job live
    output = run.canceller.stdout.read()
    assert run.canceller.returncode == 0, output
    cancelled = json.loads(output.strip().splitlines()[-1])
    assert cancelled["checkpoint_step"] is not None, cancelled
    step = cancelled["checkpoint_step"]
    assert (run.dir / "checkpoints" / f"step-{step:08d}" / "COMPLETE").is_file()
    final = handle.wait(timeout_s=60, poll_s=1)
    assert final["state"] == "CANCELLED" and handle.finished(), final
    assert run.job["JobState"] == "CANCELLED", run.job
