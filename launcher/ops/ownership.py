"""A run directory belongs to one job: a launch into a directory whose job still runs is refused, and
two launches racing for one directory cannot both submit.

- Live job: the job ids run.json recorded, asked of SLURM in one `squeue` call; a job pending,
  running, requeued, suspended, ... (launcher.ops.status.ACTIVE_STATES) owns the directory. Once it has
  ended, the same command resumes the run as before. Where SLURM cannot be asked (no client here, no
  controller), a warning says the check was skipped: the sbatch executor could not submit there anyway.
- The launch lock: `launch_lock` takes an exclusive `flock` on `.<run name>.lock` beside the run
  directory (created once, never removed; `runs` lists directories only) before the live-job check
  and holds it through rendering and submission, so of two launches one submits and the other finds
  the lock taken (refused at once) or, after it, the first one's job. The local executor holds it for
  the whole run: its training process is the owner. The file holds the holder's pid, host and
  executor for the refusal's message.
- Shared storage: flock over NFS v4 (Linux maps it onto NFS byte-range locks) and Lustre (with
  `flock` mounts) is cluster-wide. Where the file system refuses flock (ENOLCK, EOPNOTSUPP: NFS v3
  without lockd, Lustre `noflock`), the fallback is an O_EXCL lock file `.<run name>.lock.excl`
  holding the pid and host, removed at release; one left by a dead process on this host is reclaimed,
  one from another host must be removed by hand (the refusal names it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from contract import protocol
from launcher import runrecord


class RunBusy(RuntimeError):
    """The run directory belongs to a live job or to a launch in progress (exit 1, nothing written)."""


def lock_path(run_dir: Path) -> Path:
    return run_dir.parent / f".{run_dir.name}.lock"


def _follow_commands(run_dir: Path) -> str:
    run = shlex.quote(str(run_dir))
    return (f"follow it with 'sft-launch logs {run} -f' and 'sft-launch status {run}', "
            f"or stop it with 'sft-launch cancel {run}'")


def _holder(executor: str) -> str:
    return f"pid {os.getpid()} on {socket.gethostname()} ({executor} executor) since {runrecord.now()}"


def _busy(run_dir: Path, holder: str) -> RunBusy:
    who = holder.strip() or "another sft-launch"
    if "(local executor)" in who:
        return RunBusy(f"{run_dir}: a local run is training in it ({who}); stop it with Ctrl-C or "
                       f"kill -USR1 {who.split()[1]} (it checkpoints), then run the same command to resume")
    return RunBusy(f"{run_dir}: another sft-launch is launching into it now ({who}); wait for it, then "
                   f"{_follow_commands(run_dir)}")


@contextlib.contextmanager
def _exclusive_file(path: Path, run_dir: Path, holder: str) -> Iterator[None]:
    """The O_EXCL fallback where flock is refused (see the module docstring)."""
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            text = path.read_text(encoding="utf-8", errors="replace")
            words = text.split()
            pid, host = (int(words[1]), words[3]) if len(words) > 3 and words[1].isdigit() else (0, "")
            if host == socket.gethostname() and pid and not _alive(pid):
                path.unlink(missing_ok=True)  # left by a process that died on this host
                continue
            raise _busy(run_dir, f"{text.strip()}; lock file {path}") from None
    else:
        raise _busy(run_dir, f"lock file {path}")
    try:
        os.write(fd, holder.encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def launch_lock(run_dir: Path, executor: str) -> Iterator[None]:
    """Hold the run directory's launch lock; RunBusy at once when someone else holds it."""
    path = lock_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = _holder(executor)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(run_dir, _read_holder(fd)) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            with _exclusive_file(path.with_name(path.name + ".excl"), run_dir, holder):
                yield
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _read_holder(fd: int) -> str:
    for _ in range(20):  # the holder writes its line right after taking the lock
        text = os.pread(fd, 4096, 0).decode(errors="replace")
        if text.strip():
            return text
        time.sleep(0.05)
    return ""


def live_job(run_dir: Path) -> tuple[str, str] | None:
    """(job id, state) of a job of this run that SLURM still runs or queues; None when none does.

    Raises launcher.ops.slurm.SlurmUnavailable when SLURM cannot be asked."""
    from launcher.ops import slurm
    from launcher.ops.status import ACTIVE_STATES

    from launcher.resolve.preflight import read_run_record

    job_ids = [str(j) for j in read_run_record(run_dir).get("job_ids", [])]
    if not job_ids:
        return None
    states = slurm.job_states(job_ids)
    for job_id in reversed(job_ids):
        state = states.get(job_id, "")
        if state in ACTIVE_STATES:
            return job_id, state
    return None


def refuse_if_owned(run_dir: Path) -> str | None:
    """RunBusy naming the live job and the commands to follow or cancel it; else None, or a warning
    line when SLURM could not be asked."""
    from launcher.ops.slurm import SlurmUnavailable

    try:
        owner = live_job(run_dir)
    except SlurmUnavailable as err:
        return f"could not ask SLURM whether this run's jobs still run ({err}); not checked"
    if owner is not None:
        job_id, state = owner
        raise RunBusy(f"{run_dir}: job {job_id} is {state} in this run directory; a second job would "
                      f"write the same checkpoints; {_follow_commands(run_dir)}")
    return None


def precheck(run_dir: Path) -> None:
    """Refuse early (before the checks and the plan are printed, writing nothing) a run directory a
    live job owns; `owned` checks again under the lock."""
    if (run_dir / protocol.RUN_RECORD).is_file():
        refuse_if_owned(run_dir)


@contextlib.contextmanager
def owned(run_dir: Path, executor: str) -> Iterator[None]:
    """Hold the launch lock and make sure no live job owns the run directory (RunBusy otherwise);
    a warning on stderr when SLURM could not be asked."""
    with launch_lock(run_dir, executor):
        warning = refuse_if_owned(run_dir)
        if warning:
            print(f"sft-launch: warning: {warning}", file=sys.stderr)
        yield


def dry_run_note(run_dir: Path) -> list[str]:
    """For a dry run's output: whether a launch now would be refused (nothing is locked or written)."""
    if not (run_dir / protocol.RUN_RECORD).is_file():
        return []
    try:
        refuse_if_owned(run_dir)
    except RunBusy as busy:
        return [f"a launch now would be refused: {busy}"]
    return []
