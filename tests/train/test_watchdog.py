"""The progress watchdog's bound (fake clock, no sleeping), the roster and heartbeat files, and how a
hang reads in the failure record (#15). The multi-process hangs are in test_hang.py."""

from __future__ import annotations

import json
import os

import pytest

from contract import failure, liveness, protocol
from train.engine.watchdog import ProgressBound, collective_failure


def test_first_step_gets_the_floor_only():
    bound = ProgressBound(floor_s=10.0)
    bound.start(step=0, now=0.0)
    assert bound.overdue(9.9) is None
    assert bound.overdue(10.5) == pytest.approx(10.5)
    bound.progress(1, now=300.0)  # a 300 s first step (compile, loading) is no sample
    assert bound.recent == type(bound.recent)() and bound.bound() == 10.0


def test_bound_grows_with_the_slowest_recent_step():
    bound = ProgressBound(floor_s=10.0, multiple=10.0)
    bound.start(step=5, now=0.0)
    now = 100.0
    bound.progress(6, now)
    for step, seconds in zip(range(7, 10), (2.0, 3.0, 2.5)):
        now += seconds
        bound.progress(step, now)
    assert bound.bound() == pytest.approx(30.0)  # 10 x the slowest (3 s)
    assert bound.overdue(now + 29.0) is None
    assert bound.overdue(now + 31.0) == pytest.approx(31.0)
    assert bound.last_step == 9


def test_fast_steps_keep_the_floor():
    bound = ProgressBound(floor_s=600.0)
    bound.start(0, 0.0)
    for step in range(1, 30):
        bound.progress(step, step * 0.5)
    assert bound.bound() == 600.0


def test_pause_exempts_a_save_and_restarts_the_wait():
    bound = ProgressBound(floor_s=10.0)
    bound.start(0, 0.0)
    bound.progress(1, 1.0)
    bound.pause()
    bound.pause()  # nested (an eval inside a paused phase)
    assert bound.overdue(500.0) is None
    bound.resume(500.0)
    assert bound.overdue(600.0) is None  # still paused once
    bound.resume(600.0)
    assert bound.overdue(609.0) is None  # the wait counts from the end of the save
    assert bound.overdue(611.0) == pytest.approx(11.0)


def test_zero_turns_the_watchdog_off():
    bound = ProgressBound(floor_s=0.0)
    bound.start(0, 0.0)
    assert bound.overdue(1e9) is None


def test_roster_and_heartbeats_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    line = liveness.append_roster(tmp_path)
    assert set(line) == {"time", "rank", "local_rank", "world", "host", "pid", "job", "restart"}
    assert (line["rank"], line["local_rank"], line["world"], line["job"], line["restart"]) == (3, 1, 4, "77", 2)
    assert liveness.read_roster(tmp_path, job="77", restart=2) == [line]
    assert liveness.read_roster(tmp_path, restart=1) == []

    liveness.write_heartbeat(tmp_path, step=12, step_time=1000.0)
    path = tmp_path / protocol.LOGS_DIR / protocol.HEARTBEAT_DIR / "rank-00003.json"
    beat = json.loads(path.read_text())
    assert beat["step"] == 12 and beat["pid"] == os.getpid() and beat["job"] == "77"
    assert liveness.read_heartbeats(tmp_path) == {3: beat}
    assert [p.name for p in path.parent.iterdir()] == ["rank-00003.json"]  # no temp file left
    assert liveness.silent_ranks({3: beat}, now=beat["time"] + 1) == []
    assert liveness.silent_ranks({3: beat}, now=beat["time"] + liveness.SILENT_AFTER_S + 1) == [3]
    assert liveness.missing_ranks({3: beat}, world=4) == [0, 1, 2]


def test_a_hang_record_reads_as_one_line_and_exit_76(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    failure.record_failure(tmp_path, protocol.EXIT_HUNG, "no progress for 312 s after step 40 (hung collective?)",
                           extra={"hang": {"waited_s": 312.0, "silent_ranks": [5]}})
    record = failure.first_failure(tmp_path)
    assert record["hang"]["silent_ranks"] == [5] and record["rank"] == 3
    assert failure.describe(record) == f"rank 3 on {record['host']}: no progress for 312 s after step 40 (hung collective?)"
    assert failure.exit_code_of(record, 1) == protocol.EXIT_HUNG


def test_collective_errors_are_told_apart_from_others():
    class DistBackendError(RuntimeError):
        pass

    assert collective_failure(RuntimeError("[gloo/transport/tcp/pair.cc:538] Connection closed by peer [127.0.0.1]:1"))
    assert collective_failure(RuntimeError("Timed out waiting 5000ms for recv operation to complete"))
    assert collective_failure(DistBackendError("NCCL error"))
    assert not collective_failure(RuntimeError("CUDA out of memory"))
    assert not collective_failure(ValueError("timed out"))  # not a runtime (communication) error
