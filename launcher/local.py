"""The local executor: the same run directory and training command as on SLURM, on this machine.

Requeue protocol, locally: SIGUSR1 or SIGTERM to sft-launch writes the stop file and forwards
SIGUSR1 to the training process group; training checkpoints and exits 75; running the same
command again resumes from the checkpoint (the run directory name is deterministic).
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
from collections.abc import Callable
from pathlib import Path

from launcher.options import Launch
from train import failure
from train.config import EXIT_REQUEUE

log = logging.getLogger(__name__)

# Tests point this at a stand-in module until/unless they exercise the real `train` package.
TRAIN_MODULE_ENV = "SFT_LAUNCH_TRAIN_MODULE"
COMPLETE_MARKER = "COMPLETE"  # checkpoint marker file (ARCHITECTURE.md)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_command(launch: Launch, port: int) -> list[str]:
    run_dir = launch.run_dir
    return [
        sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch",  # = `accelerate launch`
        "--config_file", str(run_dir / "accelerate.yaml"),
        "--num_machines", "1", "--machine_rank", "0",
        "--num_processes", str(launch.world_size),
        "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
        "-m", os.environ.get(TRAIN_MODULE_ENV, "train"),
        "--config", str(run_dir / "train.toml"),
    ]


def checkpointed_after_stop(run_dir: Path, stop_file: Path, checkpoint_dir: Path) -> bool:
    """A complete checkpoint newer than the stop request.

    torchrun reports any non-zero worker exit as its own exit 1, so 75 from the training processes
    does not survive `accelerate launch`; this file-system check recovers it (same rule as launch.slurm).
    """
    if not stop_file.exists():
        return False
    stop_time = stop_file.stat().st_mtime
    markers = checkpoint_dir.glob(f"step-*/{COMPLETE_MARKER}")
    return any(marker.stat().st_mtime >= stop_time for marker in markers)


def _ignore_usr1() -> None:
    # The accelerate/torchrun parent would die of SIGUSR1 (no handler); the training processes
    # install their own handler, which replaces the inherited "ignore".
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        return child.wait()


def run_local(launch: Launch) -> int:
    """Run training in a new process group; return its exit code (75 = checkpointed, run again to resume)."""
    run_dir = launch.run_dir
    stop_file = run_dir / launch.train.run.stop_file  # an absolute stop_file replaces run_dir
    checkpoint_dir = run_dir / launch.train.run.checkpoint_dir
    stop_file.unlink(missing_ok=True)  # a stale request must not stop this run
    command = train_command(launch, _free_port())
    log.info("running: %s", " ".join(command))
    started = time.time()
    child = subprocess.Popen(command, cwd=run_dir, start_new_session=True, preexec_fn=_ignore_usr1)

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
    if code not in (0, EXIT_REQUEUE) and checkpointed_after_stop(run_dir, stop_file, checkpoint_dir):
        code = EXIT_REQUEUE
    if code not in (0, EXIT_REQUEUE):
        code = failure.report(run_dir, started, code)  # the first failing rank's first error line, last
    return code
