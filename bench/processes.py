"""Bench child processes: the environment they run in, and a run with a log and a wall-clock limit that kills
the whole process tree (the workers of torchrun and `accelerate launch` start sessions of their own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMED_OUT = 124  # run_logged's exit code for a command it killed at its timeout (as timeout(1))


def child_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    return {**os.environ, "PYTHONPATH": pythonpath, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 4)))}


def signal_job(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """`sig` to the launcher and every process below it (the workers live in sessions of their own)."""
    import psutil

    parent = psutil.Process(proc.pid)
    for p in [parent, *parent.children(recursive=True)]:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
               errors: Path | None = None) -> int:
    """Run cmd (in the repository, with `env`, default child_env()) in a session of its own, output to
    log (stderr too, unless `errors` names its own file); on timeout it and every process below it
    are killed (torchrun's and `accelerate launch`'s workers start sessions of their own: a
    process-group kill would leave them on the GPUs). Returns the exit code, TIMED_OUT on timeout."""
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(log, "w"))
        err = files.enter_context(open(errors, "w")) if errors else subprocess.STDOUT
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env() if env is None else env, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            signal_job(proc, signal.SIGKILL)
            proc.wait()
            out.write(f"\n[bench] killed after {timeout:.0f} s, with every process below it\n")
            return TIMED_OUT
