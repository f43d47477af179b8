"""A rank that stops (SIGSTOP: a frozen node) or dies (SIGKILL) mid-training: its peer must not wait
forever, but exit 76 with a failure record, its stacks in its log, and the roster and heartbeats on
disk for the batch shell to blame the node (#15). 2 ranks, FSDP2 over gloo, faults from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.train.run_helpers import kill_job, launch_command, launch_env, read_log, write_run

from contract import failure, liveness, protocol

pytestmark = pytest.mark.slow

LONG_RUN = {"train": {"max_steps": 100000}}  # never finishes by itself


@contextmanager
def training(run_dir: Path) -> Iterator[subprocess.Popen]:
    """The 2-rank job in its own process group; killed (all of it) on the way out."""
    with open(run_dir / "train.log", "w") as log:
        proc = subprocess.Popen(launch_command(run_dir), cwd=run_dir, env=launch_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            kill_job(proc)  # the job may have ended by itself


def wait_for(what: str, check, proc: subprocess.Popen, run_dir: Path, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{read_log(run_dir)}"
        assert proc.poll() is None or what.startswith("record"), f"job ended ({proc.returncode})\n{read_log(run_dir)}"
        time.sleep(0.2)
    return found


def rank1_pid_after_steps(proc: subprocess.Popen, run_dir: Path) -> int:
    """Rank 1's pid (from the roster) once its heartbeat shows completed steps."""
    wait_for("rank 1 stepping", lambda: liveness.read_heartbeats(run_dir).get(1, {}).get("step", 0) >= 1,
             proc, run_dir, timeout=120)
    roster = {line["rank"]: line for line in liveness.read_roster(run_dir)}
    assert set(roster) == {0, 1} and {line["world"] for line in roster.values()} == {2}, roster
    return roster[1]["pid"]


def hang_record(proc: subprocess.Popen, run_dir: Path, timeout: float) -> dict[str, Any]:
    return wait_for("record of exit 76", lambda: failure.first_failure(run_dir), proc, run_dir, timeout)


def process_gone(pid: int) -> bool:
    """Exited (a zombie not yet reaped by torchrun counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def hang_run(tmp_path: Path, hang_timeout_s: int, collective_timeout_s: int) -> Path:
    return write_run(tmp_path / "run", {**LONG_RUN, "run": {"dir": ".", "hang_timeout_s": hang_timeout_s,
                                                            "collective_timeout_s": collective_timeout_s}})


def signal_rank1(proc: subprocess.Popen, run_dir: Path, sig: signal.Signals) -> float:
    """Send `sig` to rank 1 once it has stepped; returns when (time.monotonic)."""
    os.kill(rank1_pid_after_steps(proc, run_dir), sig)
    return time.monotonic()


def test_frozen_rank_makes_its_peer_exit_76_with_stacks_and_blame(tmp_path):
    run_dir = hang_run(tmp_path, 20, 300)
    with training(run_dir) as proc:
        frozen = signal_rank1(proc, run_dir, signal.SIGSTOP)
        record = hang_record(proc, run_dir, timeout=90)
        waited = time.monotonic() - frozen
        rank0_pid = {line["rank"]: line["pid"] for line in liveness.read_roster(run_dir)}[0]
        wait_for("rank 0 to exit", lambda: process_gone(rank0_pid), proc, run_dir, timeout=10)
    log = read_log(run_dir)
    assert record["exit_code"] == protocol.EXIT_HUNG and record["rank"] == 0, record
    hang = record["hang"]
    assert hang["silent_ranks"] == [1] and hang["waited_s"] >= 20 and hang["last_step"] >= 1, record
    assert waited < hang["bound_s"] + 15, (waited, record)
    assert failure.describe(record).startswith(f"rank 0 on {record['host']}: no progress for "), record
    assert f"rank 0 on {record['host']}: no progress for" in log and "silent ranks: 1 (" in log, log
    assert "most recent call first" in log and "watchdog.py" in log, log  # faulthandler's dump of all threads
    beats = liveness.read_heartbeats(run_dir)
    assert set(beats) == {0, 1} and beats[0]["time"] - beats[1]["time"] > liveness.SILENT_AFTER_S, beats
    assert all(beat["host"] == record["host"] for beat in beats.values())


def test_killed_rank_ends_its_peer_promptly(tmp_path):
    run_dir = hang_run(tmp_path, 60, 300)
    with training(run_dir) as proc:
        killed = signal_rank1(proc, run_dir, signal.SIGKILL)
        code = proc.wait(timeout=60)  # neither the watchdog (60 s) nor the collective timeout (300 s)
        took = time.monotonic() - killed
    log = read_log(run_dir)
    record = failure.first_failure(run_dir)
    print(f"exit {code} after {took:.1f} s; record {json.dumps(record)}")
    assert took < 45, log
    # gloo sees the peer's socket close at once ("Connection reset by peer"): rank 0's collective
    # raises and train/main.py records 76. torchrun, which saw rank 1 die first, SIGTERMs rank 0 and
    # reports rank 1's SIGKILL as the root cause and its own exit 1: the record is what says 76.
    assert record is not None and record["rank"] == 0 and record["exit_code"] == protocol.EXIT_HUNG, (record, log)
    assert record["message"].startswith("collective failed (a peer died or hung?)"), record
    assert record["hang"] == {"collective": True, "silent_ranks": []}, record  # died, not frozen: beat recently
    assert code == 1 and "exitcode  : -9" in log, log
    assert failure.exit_code_of(record, code) == protocol.EXIT_HUNG


def test_collective_timeout_gives_up_without_the_watchdog(tmp_path):
    run_dir = hang_run(tmp_path, 0, 5)
    with training(run_dir) as proc:
        frozen = signal_rank1(proc, run_dir, signal.SIGSTOP)
        record = hang_record(proc, run_dir, timeout=60)
        took = time.monotonic() - frozen
    assert record["exit_code"] == protocol.EXIT_HUNG and record["hang"]["collective"], record
    assert took < 30, (took, record)  # 5 s, not gloo's default 30 minutes
