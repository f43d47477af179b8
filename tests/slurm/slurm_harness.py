"""Talk to the local test cluster (tests/slurm/cluster.sh) with the real SLURM commands.

There is no accounting database: job state comes from `scontrol show job -o`, which keeps
finished jobs visible for MinJobAge (30 min in slurm.conf.in).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

CLUSTER_SCRIPT = Path(__file__).with_name("cluster.sh")
NOT_UP_REASON = "local SLURM cluster not up: run tests/slurm/cluster.sh up"
FINISHED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
# How often the tests ask SLURM about jobs (`scontrol show job`, `scontrol show hostnames`). Each ask is a
# process and an RPC: asked at every tick (4 jobs, 0.05 s apart) they took a good part of the 2-core host
# from the training they wait for. What must react fast (a local file: the training's step) keeps its tick.
STATE_POLL_S = 1.0
# `Key=value` pairs of `scontrol -o` output; values may contain spaces (e.g. Reason=...), so a value
# runs until the next ` Key=`.
_FIELD = re.compile(r"(?:^|\s)([A-Za-z:/_]+)=(.*?)(?=\s+[A-Za-z:/_]+=|\s*$)")


class SlurmError(RuntimeError):
    pass


def _run(
    *cmd: str, check: bool = True, timeout: float = 30, cwd: str | Path | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def cluster_problem(min_idle_nodes: int = 2) -> str | None:
    """None when a controller answers with at least `min_idle_nodes` usable nodes, else why not."""
    if shutil.which("sinfo") is None:
        return f"{NOT_UP_REASON} (sinfo not installed: run tests/slurm/cluster.sh install)"
    try:
        proc = _run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
    except subprocess.TimeoutExpired:
        return f"{NOT_UP_REASON} (sinfo timed out)"
    if proc.returncode != 0:
        return f"{NOT_UP_REASON} ({proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'sinfo failed'})"
    # Busy nodes (mix/alloc) from an earlier test still count: they are up and will free up.
    usable = {line.split()[0] for line in proc.stdout.splitlines() if line.split()[-1] in ("idle", "mix", "alloc")}
    if len(usable) < min_idle_nodes:
        return f"{NOT_UP_REASON} (usable nodes: {sorted(usable) or 'none'})"
    return None


# Set by scripts/test.sh (which brings up the 3-node cluster first): a cluster with fewer usable nodes
# than this fails the real-SLURM tests instead of skipping them, so a DOWN node cannot pass as green.
REQUIRE_NODES_ENV = "SFT_REQUIRE_SLURM_NODES"


@functools.cache
def _first_cluster_problem(min_idle_nodes: int) -> str | None:
    """Checked once per session: a node a test kills on purpose must not fail the tests after it."""
    return cluster_problem(min_idle_nodes)


def require_cluster(min_idle_nodes: int = 2) -> None:
    """Skip the calling test when the cluster is not usable; fail it instead under
    $SFT_REQUIRE_SLURM_NODES (which also raises the node count every test asks for)."""
    import pytest

    required = int(os.environ.get(REQUIRE_NODES_ENV, "0") or 0)
    problem = _first_cluster_problem(max(min_idle_nodes, required))
    if problem and required:
        pytest.fail(f"{problem}; {REQUIRE_NODES_ENV}={required}: the suite needs that many usable nodes")
    if problem:
        pytest.skip(f"{problem}; this test needs {min_idle_nodes} nodes: tests/slurm/cluster.sh up --nodes 3")


def parse_fields(line: str) -> dict[str, str]:
    return {key: value for key, value in _FIELD.findall(line.strip())}


def show_job(job_id: int) -> dict[str, str]:
    """All fields of `scontrol show job -o JOB` (JobState, Restarts, ExitCode, Reason, NodeList, ...)."""
    proc = _run("scontrol", "show", "job", "-o", str(job_id))
    return parse_fields(proc.stdout.splitlines()[0])


def submit(script: str | Path, *sbatch_args: str, cwd: str | Path | None = None) -> int:
    """sbatch a script file and return the job id."""
    proc = _run("sbatch", "--parsable", *sbatch_args, str(script), cwd=cwd)
    return int(proc.stdout.strip().split(";")[0])


class PollThrottle:
    """For a loop that ticks faster than it may ask SLURM: `due()` is True at most once per `every_s`
    (the first call is), so the loop asks only on those ticks."""

    def __init__(self, every_s: float = STATE_POLL_S):
        self.every_s = every_s
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.every_s
        return True


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.25) -> object:
    """Poll `predicate` until it returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def wait_state(job_id: int, states: Iterable[str] | str, timeout: float = 120) -> dict[str, str]:
    """Wait until the job's JobState is one of `states`; returns its fields. Fails early if it
    finished in some other state."""
    wanted = {states} if isinstance(states, str) else set(states)
    last: dict[str, str] = {}

    def reached() -> dict[str, str] | None:
        nonlocal last
        last = show_job(job_id)
        state = last.get("JobState", "")
        if state in wanted:
            return last
        if state in FINISHED_STATES:
            raise SlurmError(f"job {job_id} ended {state} (wanted {sorted(wanted)}): {_summary(last)}")
        return None

    try:
        return wait_until(reached, timeout, f"job {job_id} to reach {sorted(wanted)}",  # type: ignore[return-value]
                          interval=STATE_POLL_S)
    except TimeoutError as err:
        raise TimeoutError(f"{err}; now {_summary(last)}") from None


def wait_all_finished(job_ids: Iterable[int], timeout: float) -> dict[int, dict[str, str]]:
    """Wait until every job is in a finished state; returns their fields (concurrent jobs)."""
    pending = list(job_ids)
    done: dict[int, dict[str, str]] = {}

    def all_done() -> bool:
        for job_id in list(pending):
            fields = show_job(job_id)
            if fields.get("JobState") in FINISHED_STATES:
                done[job_id] = fields
                pending.remove(job_id)
        return not pending

    try:
        wait_until(all_done, timeout, f"jobs {pending} to finish", interval=STATE_POLL_S)
    except TimeoutError as err:
        raise TimeoutError(f"{err}; now " + "; ".join(_summary(show_job(j)) for j in pending)) from None
    return done


def signal_batch(job_id: int, signal: str = "USR1") -> None:
    """What a preemption / time-limit warning looks like: the signal reaches only the batch shell."""
    _run("scancel", f"--signal={signal}", "--batch", str(job_id))


def signal_steps(job_id: int, signal: str = "TERM") -> None:
    """A signal to the job's steps only (the training processes and their launchers), not to the batch shell."""
    _run("scancel", f"--signal={signal}", str(job_id))


def cancel(job_id: int) -> None:
    _run("scancel", str(job_id), check=False)


def _summary(fields: dict[str, str]) -> str:
    keys = ("JobId", "JobState", "Reason", "ExitCode", "Restarts", "NodeList", "StdOut")
    return " ".join(f"{k}={fields[k]}" for k in keys if k in fields)
