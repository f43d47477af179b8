"""`sft-launch cancel RUN [--now] [--wait S]`: final checkpoint first, then scancel.

Protocol (sbatch and submitit executors alike):
1. write RUN/CANCEL_REQUESTED and record `cancel_requested` in run.json: the job must not be
   requeued after this stop (the batch shell / submitit checkpoint hook check the file);
2. ask for a checkpoint: `scancel --signal=USR1 --batch JOB` (the batch shell's trap writes the
   stop file) or, for submitit jobs, `scancel --signal=USR1 JOB` (submitit's handler in the tasks);
3. wait (bounded) for a COMPLETE checkpoint newer than the request, or for the job to leave RUNNING;
4. `scancel JOB`, wait for SLURM to report it finished, record `cancel` in run.json, remove the file.
`--now` skips 2-3 and writes no checkpoint: the job's srun steps (the training processes) get
SIGKILL first, step by step (`scancel --signal=KILL JOB.N`: straight to their tasks, which cannot
catch it), then step 4, whose SIGTERM would otherwise reach the batch shell's trap and the training
processes' handler and ask for a checkpoint. A pending job has nothing to save and is cancelled at once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from contract import protocol
from launcher import runrecord
from launcher.ops import rundir, slurm
from launcher.usage import Parser

POLL_S = 1.0
FINISH_WAIT_S = 60  # scancel -> SLURM reports the job finished (KillWait + epilog)
DEFAULT_WAIT_S = 300


def _record(run_dir: Path, event: str, job_id: str, **fields: Any) -> None:
    runrecord.record_event(run_dir / protocol.RUN_RECORD, event, {"job_id": job_id, "by": "sft-launch cancel", **fields})


def _state(job_id: str) -> str:
    fields = slurm.job_fields(job_id)
    return fields.get("JobState", "UNKNOWN") if fields else "GONE"


def _finished(state: str) -> bool:
    return state == "GONE" or state in slurm.FINISHED_STATES


def wait_for_final_checkpoint(run_dir: Path, job_id: str, since: float, wait_s: float) -> int | None:
    """Step of a complete checkpoint written after `since`; None if none came before the job stopped
    running or `wait_s` ran out."""
    deadline = time.monotonic() + wait_s
    while True:
        fresh = [step for step, path in rundir.complete_checkpoints(run_dir)
                 if (path / protocol.CHECKPOINT_MARKER).stat().st_mtime >= since]
        if fresh:
            return max(fresh)
        if _state(job_id) != "RUNNING" or time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def _wait_finished(job_id: str) -> str:
    deadline = time.monotonic() + FINISH_WAIT_S
    state = _state(job_id)
    while not _finished(state) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = _state(job_id)
    return state


def cancel_run(run_dir: Path, now: bool = False, wait_s: float = DEFAULT_WAIT_S) -> dict[str, Any]:
    """Cancel the run's newest job (see the module docstring); returns what happened."""
    run = rundir.read_run_json(run_dir)
    job_ids = [str(j) for j in run.get("job_ids", [])]
    if not job_ids:
        start = (run.get("events") or [{}])[-1]  # a local run that is still going: its launcher's pid
        who = f"kill -USR1 {start['pid']} on {start.get('host')}" if start.get("event") == "start" and \
            start.get("pid") else "kill -USR1 its sft-launch"
        raise RuntimeError(f"{run_dir}: no SLURM job in run.json; a local run stops at a checkpoint with Ctrl-C "
                           f"in its terminal or {who}")
    job_id = job_ids[-1]
    state = _state(job_id)
    if _finished(state):
        return {"job_id": job_id, "state": state, "already_finished": True, "checkpoint_step": None}
    cancel_file = run_dir / protocol.CANCEL_FILE
    cancel_file.write_text(f"{runrecord.now()} job {job_id}\n", encoding="utf-8")
    since = cancel_file.stat().st_mtime
    _record(run_dir, "cancel_requested", job_id, now=int(now))
    step = None
    if not now and state == "RUNNING":
        batch = [] if rundir.executor(run) == "submitit" else ["--batch"]
        print(f"sft-launch: asking job {job_id} for a final checkpoint (USR1); waiting up to {wait_s:.0f} s",
              flush=True)
        slurm.scancel("--signal=USR1", *batch, job_id)
        step = wait_for_final_checkpoint(run_dir, job_id, since, wait_s)
        print(f"sft-launch: final checkpoint step {step}" if step is not None
              else "sft-launch: no final checkpoint came; cancelling anyway", flush=True)
    if now and state == "RUNNING":
        for step in slurm.job_steps(job_id):
            slurm.scancel("--signal=KILL", step)  # no handler, no trap: no checkpoint
    if not _finished(_state(job_id)):
        slurm.scancel(job_id)
    final_state = _wait_finished(job_id)
    _record(run_dir, "cancel", job_id, outcome="cancelled", checkpoint_step=step if step is not None else -1)
    cancel_file.unlink(missing_ok=True)
    return {"job_id": job_id, "state": final_state, "already_finished": False, "checkpoint_step": step}


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch cancel", description="Checkpoint, then cancel a run's job.")
    rundir.add_run_arguments(parser)
    parser.add_argument("--now", action="store_true", help="cancel at once, without a final checkpoint")
    parser.add_argument("--wait", type=float, metavar="S",
                        help="how long to wait for the final checkpoint (default: the profile's signal_lead_s)")
    args = parser.parse_args(argv)
    run_dir = rundir.resolve_run(args)
    lead = rundir.read_run_json(run_dir).get("profile", {}).get("signal_lead_s")
    result = cancel_run(run_dir, now=args.now, wait_s=args.wait or lead or DEFAULT_WAIT_S)
    if result["already_finished"]:
        print(f"job {result['job_id']} already finished ({result['state']}); nothing to cancel")
    else:
        print(f"job {result['job_id']} cancelled ({result['state']})")
    return 0
