"""The sbatch executor (launcher/execute/executors.py): `sbatch --test-only` for dry runs, `sbatch --parsable` to submit.

sbatch runs with the run directory as its working directory, so the script's relative
`#SBATCH --output=logs/...` lands there (no paths with spaces on #SBATCH lines).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contract import protocol
from launcher.execute.executors import Started

if TYPE_CHECKING:
    from launcher.resolve.options import Launch

SBATCH_TIMEOUT_S = 60

# Messages meaning "there is no reachable SLURM here", as opposed to "SLURM refused this job".
_NO_CONTROLLER = re.compile(
    r"Could not establish a configuration source|Unable to contact slurm controller|"
    r"fetch_config|Socket timed out|Connection refused", re.IGNORECASE)


class SubmitError(RuntimeError):
    """sbatch refused the job or could not run; the CLI prints it and exits 1."""


@dataclass
class TestOnlyResult:
    ran: bool  # False when sbatch is absent or no controller answers
    message: str


def _sbatch(args: list[str], run_dir: Path, script: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["sbatch", *args, script], cwd=run_dir, capture_output=True, text=True,
                              timeout=SBATCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"sbatch did not answer within {SBATCH_TIMEOUT_S} s") from None
    except OSError as err:
        raise SubmitError(f"cannot run sbatch: {err}") from None


def _message(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    return "; ".join(lines) or f"sbatch exited with {result.returncode}"


def test_only(run_dir: Path, script: str = protocol.LAUNCH_SCRIPT) -> TestOnlyResult:
    """`sbatch --test-only`: SLURM's own check of the script (partition, limits, ...)."""
    if shutil.which("sbatch") is None:
        return TestOnlyResult(False, "sbatch not found; SLURM's own check skipped")
    result = _sbatch(["--test-only"], run_dir, script)
    message = _message(result)
    if result.returncode == 0:
        return TestOnlyResult(True, message)
    if _NO_CONTROLLER.search(message):
        return TestOnlyResult(False, f"no SLURM controller reachable; SLURM's own check skipped ({message})")
    raise SubmitError(f"sbatch --test-only: {message}")


def submit(run_dir: Path, script: str = protocol.LAUNCH_SCRIPT) -> str:
    """`sbatch --parsable SCRIPT` (relative to run_dir); returns the job id. SubmitError carries sbatch's message."""
    if shutil.which("sbatch") is None:
        raise SubmitError("sbatch not found: run this on a SLURM login node, or use --executor local")
    result = _sbatch(["--parsable"], run_dir, script)
    if result.returncode != 0:
        raise SubmitError(f"sbatch: {_message(result)}")
    job_id = result.stdout.strip().split(";")[0]  # "<id>[;<cluster>]"
    if not job_id.isdigit():
        raise SubmitError(f"sbatch: unexpected answer {result.stdout.strip()!r}")
    return job_id


def check(launch: Launch, rendered: Path) -> str:
    """The executor's dry run: SLURM's own check of the rendered script."""
    return f"sbatch --test-only: {test_only(rendered).message}\ndry run: nothing submitted"


def follow_hint(run_dir: Path) -> str:
    """How to follow a queued run with our own commands (its path, relative when under the cwd)."""
    try:
        run = str(run_dir.relative_to(Path.cwd()))
    except ValueError:
        run = str(run_dir)
    run = shlex.quote(run)
    return f"follow it:  sft-launch logs {run} -f\nstate:      sft-launch status {run}"


def start(launch: Launch) -> Started:
    job_id = submit(launch.run_dir)
    return Started(protocol.EXIT_OK, f"submitted job {job_id}\n{follow_hint(launch.run_dir)}", job_id)
