"""run.json: what was submitted and what happened to it (job ids over requeues, restarts, outcomes).

Stdlib only and tiny: the batch shell on a compute node runs
`python3 -m launcher.runrecord RUN_DIR/run.json EVENT [key=value ...]` at each (re)start and outcome.
Writes are atomic (temp file + rename) and serialized by an flock on the run directory, because the
launcher (recording the job id) and a starting job may touch the file at the same moment.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".run.json.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def update(path: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Read-modify-write run.json under the directory lock; returns the new content."""
    path = Path(path)
    with _locked(path.parent):
        data = read(path)
        change(data)
        write_atomic(path, data)
    return data


def add_job_id(data: dict[str, Any], job_id: str) -> None:
    job_ids = data.setdefault("job_ids", [])
    if job_id and job_id not in job_ids:
        job_ids.append(job_id)


def record_event(path: Path, event: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Append an event stamped with time, host, SLURM job id and restart count."""
    entry = {
        "event": event,
        "time": now(),
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID", ""),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
        **fields,
    }

    def change(data: dict[str, Any]) -> None:
        add_job_id(data, entry["job_id"])
        data.setdefault("events", []).append(entry)

    return update(path, change)


def _parse_fields(items: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        fields[key] = int(value) if value.lstrip("-").isdigit() else value
    return fields


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m launcher.runrecord RUN_JSON EVENT [key=value ...]", file=sys.stderr)
        return 2
    try:
        record_event(Path(args[0]), args[1], _parse_fields(args[2:]))
    except OSError as err:
        print(f"launcher.runrecord: {args[0]}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
