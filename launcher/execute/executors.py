"""Executors: how a rendered run directory is run. One call shape, one dry-run path.

An executor is a module with two functions:

    check(launch, rendered) -> str   dry run: what it can verify without starting anything, given the
                                     files rendered into the directory `rendered` (the text to print)
    start(launch) -> Started         submit or run the rendered run directory

registered by name in EXECUTORS (imported only when used: the CLI must stay instant). `execute`
renders the run directory, then either checks or starts, and records a job id in run.json. A dry
run renders into a temporary directory and leaves the run directory alone (launcher/execute/dryrun.py).
Its callers (`sft-launch`, `launcher.submit`) hold the run directory's launch lock around a real one
and refuse it while a job of the run still lives (launcher/ops/ownership.py). To add an executor: a
module with check/start and one line in EXECUTORS (`--executor` lists its keys).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from launcher.resolve.options import Launch

EXECUTORS: dict[str, str] = {
    "sbatch": "launcher.execute.sbatch",  # default: sbatch launch.slurm
    "local": "launcher.execute.local",  # this machine, no SLURM
    "submitit": "launcher.execute.submitit_exec",  # through submitit
}
DETACHED = ("sbatch", "submitit")  # they return once the job is queued (the Python API accepts only these)


@dataclass
class Started:
    exit_code: int
    message: str = ""  # what happened / how to follow the job
    job_id: str | None = None  # recorded in run.json when set


class Executor(Protocol):
    def check(self, launch: Launch, rendered: Path) -> str: ...

    def start(self, launch: Launch) -> Started: ...


def get(name: str) -> Executor:
    return importlib.import_module(EXECUTORS[name])  # type: ignore[return-value]


def execute(launch: Launch, command: list[str], dry_run: bool) -> Started:
    """Render the run directory, then check it (dry run) or start it with the launch's executor."""
    from launcher.execute.render import record_submission, write_run_dir

    executor = get(launch.executor)
    if dry_run:
        from launcher.execute.dryrun import dry_run as check_rendered

        return Started(0, check_rendered(launch, executor.check))
    run_dir = write_run_dir(launch, command)
    started = executor.start(launch)
    if started.job_id is not None:
        record_submission(run_dir, started.job_id)
    return started
