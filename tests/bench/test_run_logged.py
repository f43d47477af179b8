"""bench/common/processes.py: run_logged, which every bench script that starts training runs its children
with (gpu_single, gpu_qlora, gpu_strategies): a timeout kills the whole process tree, workers that
started sessions of their own included (as torchrun's and `accelerate launch`'s do). run_machines,
which starts the 2 machines of a multi-GPU job (bench/multi/host.py: launch): one that fails takes the other down."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common.processes import TIMED_OUT, run_logged, run_machines


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))  # a zombie is gone too


def test_a_timeout_kills_a_worker_in_a_session_of_its_own(tmp_path: Path) -> None:
    pid_file, log, errors = tmp_path / "worker.pid", tmp_path / "out.log", tmp_path / "err.log"
    script = f"setsid sleep 300 & echo $! > {pid_file}; echo to-stdout; echo to-stderr >&2; sleep 300"
    started = time.monotonic()
    assert run_logged(["bash", "-c", script], log, 3, dict(os.environ), errors=errors) == TIMED_OUT
    assert time.monotonic() - started < 60
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the setsid worker outlived the timeout"
    assert log.read_text().startswith("to-stdout\n") and "killed after 3 s" in log.read_text()
    assert errors.read_text() == "to-stderr\n"


def test_the_exit_code_and_the_combined_log_of_a_run_that_ends(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    assert run_logged(["bash", "-c", "echo a; echo b >&2; exit 3"], log, 30, dict(os.environ)) == 3
    assert log.read_text() == "a\nb\n"


def test_a_machine_that_fails_takes_the_other_down_with_its_workers(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    waiting = f"setsid sleep 300 & echo $! > {pid_file}; sleep 300"  # a peer waiting in its collectives
    jobs = [(["bash", "-c", "sleep 1; exit 1"], tmp_path / "machine0.log", dict(os.environ)),
            (["bash", "-c", waiting], tmp_path / "machine1.log", dict(os.environ))]
    started = time.monotonic()
    codes = run_machines(jobs, 120)
    assert time.monotonic() - started < 30, "the waiting machine was left to its timeout"
    assert codes[0] == 1 and codes[1] < 0, codes  # the failure's own code; the peer killed by a signal
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the peer's setsid worker outlived the failure"
    assert "killed: machine 0 exited with 1" in (tmp_path / "machine1.log").read_text()


def test_machines_that_finish_return_their_codes_and_a_timeout_kills_every_one(tmp_path: Path) -> None:
    env = dict(os.environ)
    done = [(["bash", "-c", "echo one"], tmp_path / "a.log", env),
            (["bash", "-c", "sleep 1; echo two"], tmp_path / "b.log", env)]
    assert run_machines(done, 60) == [0, 0]
    assert (tmp_path / "a.log").read_text() == "one\n" and (tmp_path / "b.log").read_text() == "two\n"
    stuck = [(["bash", "-c", "sleep 300"], tmp_path / name, env) for name in ("c.log", "d.log")]
    assert run_machines(stuck, 2) == [TIMED_OUT, TIMED_OUT]
    assert "killed after 2 s" in (tmp_path / "d.log").read_text()
