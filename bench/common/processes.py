"""Bench child processes: the environment they run in, and a run with a log and a wall-clock limit that kills
the whole process tree (the workers of torchrun and `accelerate launch` start sessions of their own)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMED_OUT = 124  # run_logged's exit code for a command it killed at its timeout (as timeout(1))
POLL_S = 0.5  # how often a run looks at its processes


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
    return _run_together([(cmd, log, child_env() if env is None else env, errors)], timeout)[0]


def run_machines(jobs: list[tuple[list[str], Path, dict[str, str]]], timeout: float | None) -> list[int]:
    """The machines of one job, each (command, log, env) run as run_logged runs one, all at once, and ended
    as `srun --kill-on-bad-exit` ends a job: once one exits with an error every other is killed with every
    process below it. Its peers would otherwise wait in their collectives until the timeout (8B on 4 H100s,
    a save that failed on one machine: the other waited 6 minutes of the lease). Returns each machine's code:
    TIMED_OUT for those killed at `timeout`, the kill's negative signal number for those killed for a peer."""
    return _run_together([(cmd, log, env, None) for cmd, log, env in jobs], timeout)


def _run_together(jobs: list[tuple[list[str], Path, dict[str, str], Path | None]], timeout: float | None) -> list[int]:
    """Each (command, log, env, stderr file or None: into the log) in a session of its own, all at once; once
    one fails or `timeout` passes, the others are killed with their process trees (run_machines' codes)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with contextlib.ExitStack() as files:
        outs = [files.enter_context(open(log, "w")) for _, log, _, _ in jobs]
        errs = [files.enter_context(open(errors, "w")) if errors else subprocess.STDOUT for *_, errors in jobs]
        procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)
                 for (cmd, _, env, _), out, err in zip(jobs, outs, errs)]
        while any(proc.poll() is None for proc in procs):
            failed = [i for i, proc in enumerate(procs) if proc.returncode not in (None, 0)]
            if failed:
                why = f"killed: machine {failed[0]} exited with {procs[failed[0]].returncode}"
            elif deadline is not None and time.monotonic() > deadline:
                why = f"killed after {timeout:.0f} s"
            else:
                time.sleep(POLL_S)
                continue
            running = [i for i, proc in enumerate(procs) if proc.poll() is None]
            for i in running:
                _kill(procs[i], outs[i], why)
            return [TIMED_OUT if i in running and not failed else proc.returncode for i, proc in enumerate(procs)]
        return [proc.returncode for proc in procs]


def _kill(proc: subprocess.Popen, out, why: str) -> None:
    signal_job(proc, signal.SIGKILL)
    proc.wait()
    out.write(f"\n[bench] {why}, with every process below it\n")
