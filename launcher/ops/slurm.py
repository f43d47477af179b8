"""The few SLURM queries and signals the run commands need (`scontrol -o`, `squeue`, `scancel`).

No accounting database is assumed: a job that slurmctld has forgotten (after MinJobAge) answers
"Invalid job id", and callers fall back to what run.json recorded.
"""

from __future__ import annotations

import re
import shutil
import subprocess

TIMEOUT_S = 30
FINISHED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                             "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"})
# `Key=value` pairs of `scontrol -o`; a value (e.g. Reason=...) may hold spaces, so it runs to the next ` Key=`.
_FIELD = re.compile(r"(?:^|\s)([A-Za-z:/_]+)=(.*?)(?=\s+[A-Za-z:/_]+=|\s*$)")


class SlurmUnavailable(RuntimeError):
    """No SLURM client here, or the controller did not answer."""


def available() -> bool:
    return shutil.which("scontrol") is not None


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmUnavailable(f"{cmd[0]}: {err}") from None


def job_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job -o JOB` as a dict; None when SLURM no longer knows the job."""
    if not available():
        raise SlurmUnavailable("scontrol not found")
    proc = run(["scontrol", "show", "job", "-o", str(job_id)])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return None
        raise SlurmUnavailable(f"scontrol show job {job_id}: {proc.stderr.strip() or proc.returncode}")
    first = proc.stdout.splitlines()[0] if proc.stdout.strip() else ""
    return parse_fields(first) or None


def parse_fields(line: str) -> dict[str, str]:
    """`Key=value ...` of one `scontrol -o` line as a dict."""
    return {key: value for key, value in _FIELD.findall(line.strip())}


def job_states(job_ids: list[str] | None = None) -> dict[str, str]:
    """{job id: state} of every job slurmctld still knows, or of those of `job_ids` it knows (one
    `squeue` call either way)."""
    if shutil.which("squeue") is None:
        raise SlurmUnavailable("squeue not found")
    only = ["-j", ",".join(job_ids)] if job_ids else []
    proc = run(["squeue", "-h", "-t", "all", *only, "-o", "%i|%T"])
    if proc.returncode != 0 and only and "Invalid job id" in proc.stderr:
        return {}  # none of them is known any more
    if proc.returncode != 0:
        raise SlurmUnavailable(f"squeue: {proc.stderr.strip() or proc.returncode}")
    states = {}
    for line in proc.stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id:
            states[job_id] = state
    return states


def scancel(*args: str) -> None:
    """Run scancel; RuntimeError (exit 1) with its message when it refuses."""
    if shutil.which("scancel") is None:
        raise SlurmUnavailable("scancel not found")
    proc = run(["scancel", *args])
    if proc.returncode != 0:
        raise RuntimeError(f"scancel {' '.join(args)}: {proc.stderr.strip() or f'exit {proc.returncode}'}")


def parse_sacct(text: str) -> dict[str, str] | None:
    """The newest record of `sacct -X -n -P -o JobID,State,ExitCode,Reason` output as scontrol-like
    fields (JobState, ExitCode, Reason); None when it has none. "CANCELLED by 0" -> CANCELLED."""
    rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 3]
    if not rows:
        return None
    _, state, exit_code, reason = rows[-1][:4]
    return {"JobState": state.split()[0] if state.strip() else "UNKNOWN", "ExitCode": exit_code, "Reason": reason}


def accounting_fields(job_id: str) -> dict[str, str] | None:
    """What SLURM's accounting (`sacct`) recorded about a job slurmctld no longer knows; None where
    the cluster keeps no accounting ("accounting storage is disabled"), sacct is missing or the job
    is not in it."""
    if shutil.which("sacct") is None:
        return None
    try:
        proc = run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode,Reason"])
    except SlurmUnavailable:
        return None
    return parse_sacct(proc.stdout) if proc.returncode == 0 else None


def job_steps(job_id: str) -> list[str]:
    """The job's srun steps ("JOB.0", ...; not .batch or .extern), from `squeue -s`."""
    if shutil.which("squeue") is None:
        raise SlurmUnavailable("squeue not found")
    proc = run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i"])
    return [step for step in proc.stdout.split() if step.rpartition(".")[2].isdigit()]
