"""The local executor (launcher/execute/executors.py): the same run directory and training command as on SLURM, here.

Requeue protocol, locally: SIGUSR1 or SIGTERM to sft-launch writes the stop file and forwards
SIGUSR1 to the training process group; training checkpoints and exits 75; running the same
command again resumes from the checkpoint (the run directory name is deterministic).

Output: local rank 0's progress reaches the terminal; every rank's whole output goes to
RUN/logs/ranks/local-<start time>/rank-NNNNN.log and accelerate/torchrun's own stderr (its
ChildFailedError traceback) to launcher-<host>.log there. A failed run ends with a pointer to that
directory and the first failing rank's first error line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable

from contract import command, failure, protocol
from launcher import runrecord
from launcher.execute.executors import Started
from launcher.resolve.options import Launch

log = logging.getLogger(__name__)


def train_command(launch: Launch, port: int, attempt: str) -> list[str]:
    run_dir = launch.run_dir
    return command.train_command(
        str(run_dir / protocol.ACCELERATE_CONFIG), str(run_dir / protocol.TRAIN_CONFIG), num_machines=1,
        machine_rank=0, num_processes=launch.world_size, main_ip="127.0.0.1", main_port=port,
        accelerate=command.accelerate_of_this_python(), attempt=attempt)


def _ignore_usr1() -> None:
    # The accelerate/torchrun parent would die of SIGUSR1 (no handler); the training processes
    # install their own handler, which replaces the inherited "ignore".
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (torchrun starts each worker in a session of its own,
    so signalling the launcher's process group does not reach the training processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _kill_training(child: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every process below it."""
    victims = _descendants(child.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait(child: subprocess.Popen, on_stop: Callable[[int, object], None]) -> int:
    """Wait for training. Training runs in its own session, so Ctrl-C reaches only us: the first
    turns into a stop request (checkpoint, exit 75, resumable), a second one kills training."""
    try:
        return child.wait()
    except KeyboardInterrupt:
        on_stop(signal.SIGINT, None)
    try:
        return child.wait()
    except KeyboardInterrupt:
        _kill_training(child)
        return child.wait()


def check(launch: Launch, rendered: Path) -> str:
    """The executor's dry run: nothing to ask beyond what the launcher already validated."""
    return "dry run: nothing started"


def start(launch: Launch) -> Started:
    code = run_local(launch)
    if code == protocol.EXIT_REQUEUE:
        return Started(code, f"sft-launch: training checkpointed and stopped (exit {code}); "
                       "run the same command again to resume")
    return Started(code)


def run_local(launch: Launch) -> int:
    """Run training in a new process group; return its exit code (75 = checkpointed, run again to resume)."""
    run_dir = launch.run_dir
    stop_file = run_dir / launch.train.run.stop_file  # an absolute stop_file replaces run_dir
    checkpoint_dir = run_dir / launch.train.run.checkpoint_dir
    stop_file.unlink(missing_ok=True)  # a stale request must not stop this run
    started = time.time()
    attempt = protocol.local_attempt_name(started)
    argv = train_command(launch, protocol.free_port(), attempt)
    log.info("running: %s", " ".join(argv))
    _record(run_dir, "start", attempt=attempt, pid=os.getpid())  # status: RUNNING while this process lives
    with command.open_launcher_log(run_dir, attempt, socket.gethostname()) as launcher_log:
        # The HF cache `plan` read is the run's (_job_env).
        child = subprocess.Popen(argv, cwd=run_dir, stderr=launcher_log, start_new_session=True,
                                 preexec_fn=_ignore_usr1, env=_job_env(launch, started))

    def on_stop(signum: int, _frame: object) -> None:
        print(f"sft-launch: {signal.Signals(signum).name}: asking training to checkpoint and stop",
              file=sys.stderr, flush=True)
        stop_file.touch()
        try:
            os.killpg(child.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        code = _wait(child, on_stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = protocol.training_exit_code(code, stop_file, checkpoint_dir, run_dir, started)
    if code not in (protocol.EXIT_OK, protocol.EXIT_REQUEUE):
        code = failure.report(run_dir, started, code, attempt)  # the first failing rank's first error line, last
    _record(run_dir, "finish", exit_code=code, **({"outcome": "stopped"} if code == protocol.EXIT_REQUEUE else {}))
    return code


def _job_env(launch: Launch, started: float) -> dict[str, str]:
    """The profile's env and HF_HOME, as the job script exports them, and the attempt's start (the ranks' startup
    record counts from it)."""
    return {**launch.profile.job_env(dict(os.environ)), protocol.JOB_START_ENV: repr(started)}


def _record(run_dir: Path, event: str, **fields: object) -> None:
    """run.json's start / finish events, as the batch shell records them: `sft-launch status` reads them. No job
    id: inside an salloc session SLURM_JOB_ID is the session's, not this run's (status and ownership ask SLURM)."""
    try:
        runrecord.record_event(run_dir / protocol.RUN_RECORD, event,
                               {"executor": "local", "job_id": "", "restart": 0, **fields})
    except OSError as err:  # bookkeeping must never fail the run
        print(f"sft-launch: run.json not updated: {err}", file=sys.stderr, flush=True)
