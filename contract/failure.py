"""A failed run says why in one line: the first error of the rank that failed first.

Torch-free and stdlib-only: training processes write it, the local executor, the batch shell (on a
compute node) and `sft-launch status` read it. When a training process fails it appends one JSON
record to RUN_DIR/logs/failures.jsonl: time, rank, host, SLURM job and restart, exit code (2 bad
configuration or data, 1 runtime failure, 76 no progress: a hung or dead peer), the error's first
line, optional extra fields (`hang` for exit 76: waited_s, last_step, silent_ranks, where), and
`follow_on` for errors that only echo another rank's failure (a rank waiting for the tokenized cache that rank 0 failed to
build). The readers pick the earliest record of the attempt that is not a follow-on, so the line
the user sees is the cause, not torchrun's traceback or another rank's consequence.

    python -m contract.failure RUN_DIR SINCE EXIT_CODE
prints that line to stderr (after a pointer to the attempt's rank logs, which hold every rank's
traceback) and the exit code to report (2, 76 or 1) to stdout; the batch shell uses it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from contract import protocol
from contract.liveness import append_jsonl, identity, read_jsonl

FAILURES_FILE = Path(protocol.LOGS_DIR) / "failures.jsonl"  # relative to the run directory
EXIT_CONFIG = protocol.EXIT_USAGE
EXIT_FAILURE = protocol.EXIT_FAILURE
EXIT_HUNG = protocol.EXIT_HUNG
CLOCK_SLACK_S = 2.0  # records up to this much older than the attempt's start still count (node clocks)


class PeerFailedError(RuntimeError):
    """This rank cannot go on because another rank failed first (its record says why)."""


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "unknown error"


def record_failure(run_dir: Path, exit_code: int, message: str, follow_on: bool = False,
                   extra: dict[str, Any] | None = None) -> None:
    """Append this process's failure record; never raises (a full disk must not hide the real error).
    `extra` adds fields (e.g. `hang`); it cannot replace the standard ones."""
    record = {
        **(extra or {}), "time": time.time(), **identity(),
        "exit_code": exit_code, "follow_on": follow_on, "message": first_line(message),
    }
    append_jsonl(run_dir / FAILURES_FILE, record)


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(run_dir / FAILURES_FILE) if isinstance(r.get("time"), (int, float))]


def first_failure(run_dir: Path, since: float = 0.0) -> dict[str, Any] | None:
    """The cause: the earliest record since `since` that is not a follow-on (else the earliest one)."""
    records = [r for r in read_failures(run_dir) if r["time"] >= since - CLOCK_SLACK_S]
    causes = [r for r in records if not r.get("follow_on")] or records
    return min(causes, key=lambda r: r["time"]) if causes else None


def describe(record: dict[str, Any]) -> str:
    if record.get("exit_code") == EXIT_HUNG:  # the rank that noticed, not necessarily the culprit
        return f"rank {record.get('rank')} on {record.get('host')}: {record.get('message')}"
    return f"rank {record.get('rank')} ({record.get('host')}): {record.get('message')}"


def exit_code_of(record: dict[str, Any] | None, code: int) -> int:
    """2 when the first failure was a configuration/data error, 76 when it was a rank that stopped making
    progress (the batch shell then looks for the node to blame), else the launcher's code (1)."""
    if record is None:
        return code
    return record["exit_code"] if record.get("exit_code") in (EXIT_CONFIG, EXIT_HUNG) else EXIT_FAILURE


def report(run_dir: Path, since: float, code: int, attempt: str | None = None) -> int:
    """Print the one line (stderr) for a failed attempt and return the exit code to report; with
    `attempt`, first say where every rank's whole output is."""
    record = first_failure(run_dir, since)
    if attempt is not None:
        print(f"sft-launch: every rank's output: {protocol.rank_logs_dir(str(run_dir), attempt)}/",
              file=sys.stderr, flush=True)
    if record is not None:
        print(f"sft-launch: error: {describe(record)}", file=sys.stderr, flush=True)
    elif attempt is not None:
        print(f"sft-launch: error: training exited with {code} and no rank recorded why (killed? out of memory?)",
              file=sys.stderr, flush=True)
    return exit_code_of(record, code)


def batch_failure(run_dir: Path, since: float = 0.0) -> str | None:
    """The newest failure the batch shell itself recorded since `since` (a setup line, scontrol, the
    helpers' python), as one line; lines "JOB RESTART EPOCH EXIT_CODE WHAT..." (protocol.BATCH_FAILURES_FILE)."""
    try:
        text = (run_dir / protocol.LOGS_DIR / protocol.BATCH_FAILURES_FILE).read_text(encoding="utf-8")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        fields = line.split(" ", 4)
        if len(fields) == 5 and fields[2].isdigit() and float(fields[2]) >= since - CLOCK_SLACK_S:
            job, restart, _, code, what = fields
            return f"batch script of job {job} restart {restart}: {what} exited with {code}"
    return None


def slurm_attempt() -> str | None:
    """The batch shell's attempt (<jobid>-r<restart>) from SLURM's environment, None outside a job."""
    job = os.environ.get("SLURM_JOB_ID")
    return protocol.attempt_name(job, int(os.environ.get("SLURM_RESTART_COUNT") or 0)) if job else None


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m contract.failure RUN_DIR SINCE EXIT_CODE", file=sys.stderr)
        return EXIT_CONFIG
    print(report(Path(argv[0]), float(argv[1]), int(argv[2]), slurm_attempt()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
