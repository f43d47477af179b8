"""End to end on the local 2-node cluster: the real `sft-launch` CLI renders and sbatch-submits the
job, a tiny model trains on CPU (FSDP2 over gloo, one process per node: the model and optimizer are
sharded across the two nodes), and we preempt it, let it hit its time limit, and compare final
weights with an uninterrupted run. Every checkpoint left on disk must have the sharded layout.

All jobs are submitted at once by one module fixture and driven concurrently (the machine has two
cores; one job at a time would take far longer); each test then asserts on one run's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.slurm import slurm_harness as sh
from tests.train.run_helpers import assert_sharded_checkpoint
from train.persist.layout import complete_checkpoints

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).parent
CLUSTER_TOML = HERE / "cluster.toml"
STEPS, SAVE_STEPS = 60, 10
SUITE_TIMEOUT_S = 600

Trigger = Callable[[list[dict], Path], bool]  # (this restart's metrics records, run dir) -> signal now?


@dataclass
class Run:
    name: str
    dir: Path
    job_id: int
    triggers: list[Trigger] = field(default_factory=list)  # one preemption per trigger, in order
    signals_sent: int = 0
    notes: list[str] = field(default_factory=list)
    job: dict[str, str] = field(default_factory=dict)  # final `scontrol show job` fields


def launch(name: str, root: Path, profile: str, *flags: str, env: dict[str, str] | None = None) -> Run:
    """`sft-launch ... --executor sbatch` as a user types it; `env` (default: ours) reaches the job too."""
    run_dir = root / name
    cmd = ["sft-launch", "--cluster", str(CLUSTER_TOML), "--profile", profile, "--nodes", "2", "--model", "tiny",
           "--executor", "sbatch", "--output", str(run_dir), "--logging_steps", "1", *flags]
    env = {**(env or os.environ), "SFT_SLURM_TESTS": str(HERE)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr}"
    job_ids = json.loads((run_dir / "run.json").read_text())["job_ids"]
    return Run(name, run_dir, int(job_ids[-1]))


def metrics(run_dir: Path) -> list[dict]:
    """Training-step records of metrics.jsonl (a line being written may be incomplete)."""
    records = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "loss" in record and "step" in record:
            records.append(record)
    return records


def steps_by_restart(run_dir: Path) -> dict[int, list[int]]:
    steps: dict[int, list[int]] = {}
    for record in metrics(run_dir):
        if record.get("event") != "checkpoint":  # a save's record names the step it saved, later
            steps.setdefault(int(record.get("restart") or 0), []).append(record["step"])
    return steps


def after_steps(count: int) -> Trigger:
    """Fire once this restart has logged `count` steps."""
    return lambda records, _: len(records) >= count


def during_save(records: list[dict], run_dir: Path) -> bool:
    """Fire while a checkpoint is being written (a .tmp dir exists), or right after a step that saves."""
    if not records:
        return False
    saving = any((run_dir / "checkpoints").glob(".tmp-step-*"))
    return saving or (records[-1]["step"] % SAVE_STEPS == 0 and len(records) > 1)


def until_finished(runs: list[Run], tick: Callable[[Run], None], timeout_s: float, interval_s: float = 0.05,
                   enough: Callable[[], bool] | None = None) -> None:
    """Call `tick` on each unfinished run every `interval_s`, over and over, until every job has finished
    (run.job set; SLURM is asked at most once per sh.STATE_POLL_S), or until `enough()` says so."""
    deadline = time.monotonic() + timeout_s
    pending = {run.job_id: run for run in runs if not run.job}
    state_polls = sh.PollThrottle()
    while pending and not (enough and enough()):
        assert time.monotonic() < deadline, f"jobs still running after {timeout_s:.0f} s: {sorted(pending)}"
        poll = state_polls.due()
        for run in list(pending.values()):
            tick(run)
            fields = sh.show_job(run.job_id) if poll else {}
            if fields.get("JobState") in sh.FINISHED_STATES:
                run.job = fields
                del pending[run.job_id]
        time.sleep(interval_s)


def send_preemptions(run: Run) -> None:
    """Send the run's next preemption (scancel --signal=USR1 --batch) once its trigger fires."""
    if run.signals_sent < len(run.triggers):
        records = [r for r in metrics(run.dir) if int(r.get("restart") or 0) == run.signals_sent]
        if run.triggers[run.signals_sent](records, run.dir):
            saving = any((run.dir / "checkpoints").glob(".tmp-step-*"))
            sh.signal_batch(run.job_id)
            run.notes.append(f"USR1 after step {records[-1]['step']}{' (saving)' if saving else ''}")
            run.signals_sent += 1


def runs_root(prefix: str) -> Path:
    """The cluster must be up (sh.require_cluster: a skip, or under scripts/test.sh a failure); then a fresh
    folder for a module's run directories. Not pytest's tmp_path: concurrent pytest sessions prune each
    other's older base dirs, and these jobs run for minutes. Kept for inspection when a test fails."""
    sh.require_cluster()
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("SFT_SLURM_DIR", "/tmp")))


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, Run]]:
    root = runs_root("sft-e2e-")
    common = ("--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS))
    started = [
        launch("baseline", root, "cpu", *common),
        launch("preempt-once", root, "cpu-container", *common),
        launch("preempt-thrice", root, "cpu-nobudget", *common),
        # Never finishes on its own: each run ends at the time limit.
        launch("time-limit", root, "cpu-timelimit", "--time", "3", "--max_steps", "100000", "--save_steps", "50"),
    ]
    started[1].triggers = [after_steps(5)]
    started[2].triggers = [after_steps(5), during_save, after_steps(3)]
    try:
        until_finished(started, send_preemptions, SUITE_TIMEOUT_S)
    finally:
        for run in started:
            if not run.job:
                sh.cancel(run.job_id)
    yield {run.name: run for run in started}


def log_text(run: Run, restart: int) -> str:
    path = run.dir / "logs" / f"{run.job_id}-r{restart}.log"
    assert path.exists(), f"per-restart log {path.name} missing; logs: {sorted(p.name for p in path.parent.iterdir())}"
    return path.read_text(errors="replace")


def run_json(run: Run) -> dict:
    return json.loads((run.dir / "run.json").read_text())


def events(run: Run, kind: str) -> list[dict]:
    return [e for e in run_json(run).get("events", []) if e.get("event") == kind]


def exported_tensors(run: Run) -> dict:
    from safetensors.torch import load_file

    files = sorted((run.dir / "export").glob("*.safetensors"))
    assert files, f"{run.name}: no exported safetensors in {run.dir / 'export'}"
    tensors = {}
    for path in files:
        tensors.update(load_file(str(path)))
    return tensors


def assert_same_weights(run: Run, reference: Run) -> None:
    import torch

    mine, ref = exported_tensors(run), exported_tensors(reference)
    assert mine.keys() == ref.keys()
    differing = [name for name in ref if not torch.equal(mine[name], ref[name])]
    assert not differing, f"{run.name}: {len(differing)} tensors differ from {reference.name}, e.g. {differing[:3]}"


def assert_completed(run: Run, restarts: int) -> None:
    state = f"{run.name}: {run.job.get('JobState')} exit {run.job.get('ExitCode')}, notes {run.notes}"
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("ExitCode") == "0:0", state
    assert run.job.get("Restarts") == str(restarts), state
    assert steps_by_restart(run.dir)[restarts][-1] == STEPS


def assert_sharded_checkpoints(run: Run) -> None:
    """The checkpoints this run resumed from are FSDP2's sharded DCP layout, one shard per node."""
    checkpoints = complete_checkpoints(run.dir / "checkpoints")
    assert checkpoints, f"{run.name}: no complete checkpoint left in {run.dir / 'checkpoints'}"
    for checkpoint in checkpoints:
        assert_sharded_checkpoint(checkpoint, world=2)


def test_two_nodes_train_and_export(runs):
    run = runs["baseline"]
    assert_completed(run, restarts=0)
    log = log_text(run, 0)
    assert "world size 2" in log
    assert "world size 2 (DistributedType.FSDP)" in log, "CPU runs must shard with FSDP2, not fall back to DDP"
    # Each node's process says where it landed: machine ranks 0 and 1 (not 0 and 0), one per node.
    assert "[rank 0] INFO train.engine.model: rank 0 of 2: node rank 0, local rank 0, host node1" in log, log
    assert "[rank 1] INFO train.engine.model: rank 1 of 2: node rank 1, local rank 0, host node2" in log, log
    assert [e["host"] for e in events(run, "start")] == ["node1"]
    assert (run.dir / "export" / "config.json").exists()


def test_preemption_checkpoints_requeues_and_resumes_bitwise(runs):
    run = runs["preempt-once"]
    assert_completed(run, restarts=1)
    assert "resumed from" in log_text(run, 1)
    assert [e["restart"] for e in events(run, "start")] == [0, 1]
    assert [e.get("kind") for e in events(run, "requeue")] == ["preemption"]
    assert_sharded_checkpoints(run)
    assert_same_weights(run, runs["baseline"])


def test_requeue_works_without_scontrol_in_training_path(runs):
    run = runs["preempt-once"]
    checks = (run.dir / "path-check.txt").read_text().splitlines()
    assert sorted(checks) == sorted(["node1: scontrol=none", "node2: scontrol=none"] * 2), checks
    assert run.job.get("Restarts") == "1"


def test_three_preemptions_one_during_save(runs):
    run = runs["preempt-thrice"]
    assert_completed(run, restarts=3)
    steps = steps_by_restart(run.dir)
    for restart in (1, 2, 3):
        resumed_at = steps[restart][0] - 1
        stopped_at = steps[restart - 1][-1]
        assert resumed_at <= stopped_at, f"restart {restart} skipped steps {stopped_at}..{resumed_at}"
        assert stopped_at - resumed_at <= SAVE_STEPS, f"restart {restart} lost {stopped_at - resumed_at} steps"
    assert [e["restart"] for e in events(run, "start")] == [0, 1, 2, 3]
    # max_timeouts = 0 in this profile: preemptions must not count against it.
    assert [e.get("kind") for e in events(run, "requeue")] == ["preemption"] * 3
    assert not (run.dir / "logs" / "timeouts.txt").exists()
    assert_sharded_checkpoints(run)
    assert_same_weights(run, runs["baseline"])


def test_time_limit_requeues_then_timeout_budget_stops(runs):
    run = runs["time-limit"]
    summary = f"{run.job.get('JobState')} exit {run.job.get('ExitCode')} restarts {run.job.get('Restarts')}"
    assert run.job.get("Restarts") == "1", summary  # max_timeouts = 1: one requeue after a time-limit hit
    assert "resumed from" in log_text(run, 1)
    assert "not requeueing" in log_text(run, 1) and "max_timeouts=1" in log_text(run, 1)
    assert run.job.get("ExitCode") == "75:0", summary
    assert len((run.dir / "logs" / "timeouts.txt").read_text().splitlines()) == 2
    assert [e.get("kind") for e in events(run, "requeue")] == ["timeout"]
    assert [e.get("outcome") for e in events(run, "finish")] == ["gave-up"]
    assert_sharded_checkpoints(run)
