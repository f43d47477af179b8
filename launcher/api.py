"""Python API for driving runs from notebooks and scripts.

    from launcher.api import submit
    run = submit("tiny", nodes=2, cluster="cluster.toml", profile="cpu", max_steps=60)
    run.status()["state"]; print(run.logs()); run.cancel()   # or run.wait()

`submit` validates exactly like the CLI (ConfigError names the key), renders the run directory and
submits it (executor "submitit" by default; "sbatch" works too). `attach(run_dir)` gives a handle
to an existing run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.execute.executors import DETACHED, execute
from launcher.ops import cancel as cancel_ops
from launcher.ops import logs as logs_ops
from launcher.ops import ownership, rundir, slurm, status
from launcher.resolve.options import LaunchRequest, resolve


@dataclass(frozen=True)
class RunHandle:
    run_dir: Path

    @property
    def job_id(self) -> str | None:
        job_ids = rundir.read_run_json(self.run_dir).get("job_ids", [])
        return str(job_ids[-1]) if job_ids else None

    def status(self) -> dict[str, Any]:
        """What `sft-launch status --json` prints."""
        return status.run_status(self.run_dir)

    def logs(self, restart: int | None = None, node: int | None = None) -> str:
        """Text of the newest (or restart `restart`'s) log; '' when none exists yet."""
        run = rundir.read_run_json(self.run_dir)
        chosen = logs_ops.choose_log(rundir.log_files(self.run_dir, [str(j) for j in run.get("job_ids", [])]),
                                     restart)
        if chosen is None:
            return ""
        text = chosen.path.read_text(encoding="utf-8", errors="replace")
        if node is None:
            return text
        procs = rundir.procs_per_node(run)
        return "".join(line for line in text.splitlines(keepends=True) if logs_ops.line_node(line, procs) == node)

    def cancel(self, now: bool = False, wait_s: float = cancel_ops.DEFAULT_WAIT_S) -> dict[str, Any]:
        """Final checkpoint (unless `now`), then scancel; returns job id, final state, checkpoint step."""
        return cancel_ops.cancel_run(self.run_dir, now=now, wait_s=wait_s)

    def finished(self) -> bool:
        current = self.status()
        return current["state_source"] != "slurm" or current["state"] in slurm.FINISHED_STATES

    def wait(self, timeout_s: float | None = None, poll_s: float = 5.0) -> dict[str, Any]:
        """Block until the job has finished (across requeues); returns the final status."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.finished():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.run_dir}: job still running after {timeout_s:.0f} s")
            time.sleep(poll_s)
        return self.status()


def attach(run_dir: str | Path) -> RunHandle:
    path = Path(run_dir).expanduser().resolve()
    if not rundir.is_run_dir(path):
        raise FileNotFoundError(f"{path}: not a run directory (no run.json or train.toml)")
    return RunHandle(path)


def submit(model: str, *, nodes: int = 1, cluster: str | None = None, profile: str | None = None,
           executor: str = "submitit", output: str | None = None, data: str | list[str] | None = None,
           strategy: str | None = None, lora: bool = False, qlora: bool = False, time: str | None = None,
           context_parallel: int | None = None, job_name: str | None = None, sets: list[str] | None = None, force: bool = False,
           **train_flags: Any) -> RunHandle:
    """Validate, plan, render and submit a run; train_flags are [train] keys (max_steps=60, learning_rate=1e-5).
    A plan that does not fit in memory or on disk is refused as the CLI refuses it (ConfigError) unless `force`."""
    if executor not in DETACHED:
        raise ValueError(f"executor={executor!r}: the API submits with {' or '.join(map(repr, DETACHED))}")

    request = LaunchRequest(model=model, nodes=nodes, cluster=cluster, profile=profile, data=data, output=output,
                            strategy=strategy, lora=lora, qlora=qlora, time=time, job_name=job_name, executor=executor,
                            context_parallel=context_parallel,
                            sets=list(sets or []), train_flags=dict(train_flags))
    launch = resolve(request)
    from launcher.commands.plan_cmd import plan_launch, refuse_unless_fits, refuse_unless_room
    from launcher.resolve.preflight import check_launch

    check_launch(launch)  # data rows, model dir, container image, run dir: exit 2 before anything is written
    report = plan_launch(launch)
    refuse_unless_fits(report, force=force)  # as `sft-launch` (launcher/commands/launch.py) refuses it
    refuse_unless_room(report, force=force)
    with ownership.owned(launch.run_dir, launch.executor):  # one job per run directory
        execute(launch, ["launcher.api.submit", model], dry_run=False)
    return RunHandle(launch.run_dir)
