"""Dead or hung nodes on the local 3-node cluster (issue #15): a 2-node job loses a rank or a whole node,
the batch shell (or SLURM itself, for a dead node) requeues it on the two healthy nodes, and it finishes
with weights bitwise equal to an uninterrupted run; a bug on every rank is not requeued.

Scenarios, each a real `sft-launch --executor sbatch` run of the tiny model (profile cpu-nodefail:
20 s hang bound and collective timeout):
- kill-rank: SIGKILL rank 1's training process (found through the roster: host + pid; the nodes are
  namespaces of this host, so the pid is visible here). Its peer loses the connection and exits 76.
- stop-rank: SIGSTOP rank 1. Its peer's collective times out (or its watchdog fires) and exits 76.
- dead-node: `cluster.sh kill-node` the host of rank 1 (link down, slurmd and processes SIGKILLed);
  slurmctld marks it DOWN after SlurmdTimeout and requeues the job (NODE_FAIL); the next start blames it.
- code-bug: every rank raises at step 5 (tests/faults): no node is blamed, no requeue, one error line.
A dead node takes down every job on it, so that scenario starts once no other job can be on its node:
every other run has finished or restarted without the node its fault hit (two overlapping phases), and
the node is killed only while no other unfinished job holds it.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults import fault_env
from tests.slurm import slurm_harness as sh
from tests.slurm.test_e2e_train import Run, assert_same_weights, events, launch, log_text, metrics, until_finished

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROFILE = "cpu-nodefail"
STEPS, SAVE_STEPS = 60, 20
# The fault comes past the first checkpoint (step 20): the requeued run resumes from it, redoes steps
# 21-30 and saves again at step 40 on its way to STEPS.
FAULT_AFTER_STEPS = 30
REQUEUE_BOUND_S = 300  # issue #15: a hung rank is detected and the job requeued within 5 minutes
# Fault -> restarted without the bad node, on this cluster (20 s hang/collective bounds, SlurmdTimeout
# 20 s): the bounds docs/slurm.md states. Measured once at 16 s, 35 s and 48 s; the margin covers a
# loaded 2-core host. A killed rank is noticed at once, a frozen one after the 20 s bound, a dead node
# after SlurmdTimeout (+ up to a third of it) and SLURM's own requeue.
RESTART_BOUNDS_S = {"kill-rank": 60, "stop-rank": 120, "dead-node": 150}
PHASE_TIMEOUT_S = 420

Fault = Callable[[Run], str]  # does the damage, returns the host it hit


def roster(run: Run) -> list[dict]:
    path = run.dir / "logs" / "ranks.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def roster_line(run: Run, rank: int) -> dict:
    return [line for line in roster(run) if line["rank"] == rank and line["restart"] == 0][-1]


def signal_rank(sig: signal.Signals) -> Fault:
    def act(run: Run) -> str:
        line = roster_line(run, 1)
        os.kill(line["pid"], sig)
        return line["host"]
    return act


def kill_node(run: Run) -> str:
    host = roster_line(run, 1)["host"]
    subprocess.run(["bash", str(sh.CLUSTER_SCRIPT), "kill-node", host], check=True, capture_output=True, timeout=60)
    return host


def held_by_others(run: Run, others: list[Run]) -> bool:
    """Another unfinished job runs on the host of this run's rank 1 (a node kill would take it down too)."""
    host = roster_line(run, 1)["host"]
    unfinished = [other for other in others if other is not run and not other.job]
    return any(host in hostnames(sh.show_job(other.job_id).get("NodeList", "")) for other in unfinished)


def hostnames(node_list: str) -> list[str]:
    if node_list in ("", "(null)"):
        return []
    proc = subprocess.run(["scontrol", "show", "hostnames", node_list], capture_output=True, text=True, timeout=30,
                          check=True)
    return proc.stdout.split()


def moved_on(run: Run) -> bool:
    """Finished, or restarted (without the node its fault hit: the restart's roster lines are written)."""
    return bool(run.job) or any(line.get("restart") for line in roster(run))


def drive(runs: list[Run], faults: dict[str, Fault], fired: dict[str, tuple[str, float]],
          enough: Callable[[], bool] | None = None, guard: Callable[[Run], bool] | None = None) -> None:
    """Do each run's fault once its first attempt logged FAULT_AFTER_STEPS steps (and `guard` allows it);
    return when all finished, or when `enough()`."""
    def tick(run: Run) -> None:
        if run.name in faults and run.name not in fired:
            if len([r for r in metrics(run.dir) if not r.get("restart")]) >= FAULT_AFTER_STEPS:
                if guard is None or guard(run):
                    fired[run.name] = (faults[run.name](run), time.time())
    until_finished(runs, tick, PHASE_TIMEOUT_S, interval_s=0.1, enough=enough)


@pytest.fixture(scope="module")
def runs() -> Iterator[tuple[dict[str, Run], dict[str, tuple[str, float]]]]:
    sh.require_cluster(min_idle_nodes=3)
    root = Path(tempfile.mkdtemp(prefix="sft-nodefail-", dir=os.environ.get("SFT_SLURM_DIR", "/tmp")))
    common = ("--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS))
    fired: dict[str, tuple[str, float]] = {}
    started: list[Run] = []
    try:
        started = [launch(name, root, PROFILE, *common) for name in ("baseline", "kill-rank", "stop-rank")]
        started.append(launch("code-bug", root, PROFILE, *common, env=fault_env(dict(os.environ), raise_at_step=5)))
        phase1 = list(started)
        faults = {"kill-rank": signal_rank(signal.SIGKILL), "stop-rank": signal_rank(signal.SIGSTOP)}
        drive(phase1, faults, fired, enough=lambda: all(moved_on(run) for run in phase1))
        started.append(launch("dead-node", root, PROFILE, *common))
        # The steps are read at every tick; SLURM is asked whether the node is free at most once per
        # sh.STATE_POLL_S, and the kill follows a fresh "free" answer in the same tick.
        node_asks = sh.PollThrottle()
        drive(started, {**faults, "dead-node": kill_node}, fired,
              guard=lambda run: run.name != "dead-node" or (node_asks.due() and not held_by_others(run, started)))
    finally:
        for run in started:
            if not run.job:
                sh.cancel(run.job_id)
        for host, _ in fired.values():
            subprocess.run(["bash", str(sh.CLUSTER_SCRIPT), "revive-node", host], capture_output=True, timeout=60)
    yield {run.name: run for run in started}, fired


def _epoch(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def assert_requeued_without(run: Run, reference: Run, host: str, fault_at: float, by_slurm: bool = False) -> float:
    """Finished on two other nodes after one node-failure requeue, bitwise; returns fault -> restart seconds."""
    state = f"{run.name}: {run.job.get('JobState')} exit {run.job.get('ExitCode')} restarts {run.job.get('Restarts')}"
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "1", state
    (requeue,) = events(run, "requeue")
    assert requeue["kind"] == "node-failure" and requeue["node"] == host, requeue
    assert ("by" in requeue) == by_slurm, requeue
    assert "resumed from" in log_text(run, 1)
    hosts = {line["host"] for line in map(json.loads, (run.dir / "logs" / "ranks.jsonl").read_text().splitlines())
             if line["restart"] == 1}
    assert len(hosts) == 2 and host not in hosts, hosts
    assert (run.dir / "logs" / "node_failures.txt").read_text().split()[2] == host
    assert metrics(run.dir)[-1]["step"] == STEPS
    assert_same_weights(run, reference)
    restarted = _epoch(events(run, "start")[-1]["time"])
    return restarted - fault_at


@pytest.fixture
def scenario(runs):
    """name -> (its run, the uninterrupted baseline, the host the fault hit, when)."""
    by_name, fired = runs

    def get(name: str) -> tuple[Run, Run, str, float]:
        run = by_name[name]
        assert name in fired, f"{name}: the fault never fired (steps logged: {len(metrics(run.dir))})"
        return run, by_name["baseline"], *fired[name]
    return get


def test_killed_rank_requeues_without_its_node_and_resumes_bitwise(scenario):
    run, reference, host, at = scenario("kill-rank")
    seconds = assert_requeued_without(run, reference, host, at)
    assert "ExcNodeList=" + host in " ".join(f"{k}={v}" for k, v in run.job.items())
    print(f"\nkill-rank: SIGKILL of rank 1 on {host} -> restarted without it in {seconds:.0f} s")
    assert seconds < RESTART_BOUNDS_S["kill-rank"], f"kill-rank restarted {seconds:.0f} s after SIGKILL"


def test_stopped_rank_is_detected_and_requeued_within_five_minutes(scenario):
    run, reference, host, at = scenario("stop-rank")
    seconds = assert_requeued_without(run, reference, host, at)
    failures = [json.loads(line) for line in (run.dir / "logs" / "failures.jsonl").read_text().splitlines()]
    assert any(r["exit_code"] == 76 and r["host"] != host for r in failures), failures
    print(f"\nstop-rank: SIGSTOP of rank 1 on {host} -> detected, requeued, restarted without it in {seconds:.0f} s")
    assert seconds < min(REQUEUE_BOUND_S, RESTART_BOUNDS_S["stop-rank"]), f"stop-rank restarted {seconds:.0f} s after SIGSTOP"


def test_dead_node_is_requeued_by_slurm_recorded_and_resumes_bitwise(scenario):
    run, reference, host, at = scenario("dead-node")
    seconds = assert_requeued_without(run, reference, host, at, by_slurm=True)
    assert f"blame: {host} SLURM reports {host} down" in log_text(run, 1)
    print(f"\ndead-node: {host} killed -> SLURM requeued, restarted without it in {seconds:.0f} s")
    assert seconds < RESTART_BOUNDS_S["dead-node"], f"dead-node restarted {seconds:.0f} s after the kill"


def test_code_bug_on_every_rank_is_not_requeued(runs):
    run = runs[0]["code-bug"]
    state = f"{run.job.get('JobState')} exit {run.job.get('ExitCode')} restarts {run.job.get('Restarts')}"
    assert run.job.get("JobState") == "FAILED" and run.job.get("ExitCode") == "1:0", state
    assert run.job.get("Restarts") == "0", state
    assert not (run.dir / "logs" / "node_failures.txt").exists() and not events(run, "requeue")
    log = log_text(run, 0).strip().splitlines()
    assert any(line.startswith("sft-launch: no node to blame (") for line in log), log[-5:]
    assert log[-1].startswith("sft-launch: error: rank ") and "injected fault at step 5" in log[-1], log[-5:]
