"""Which host runs which rank, and which ranks are still alive: the roster and the heartbeats (#15).

Torch-free and stdlib-only: the training ranks write both, the batch shell's blame logic (on a compute
node, after a hang) reads them to find the node whose ranks went silent.

    RUN_DIR/logs/ranks.jsonl                   one line per rank and (re)start, appended at start-up:
        {"time", "rank", "local_rank", "world", "host", "pid", "job", "restart"}
    RUN_DIR/logs/heartbeats/rank-00003.json    rewritten atomically (tmp + os.replace):
        {"rank", "host", "pid", "job", "restart", "step", "step_time", "time"}

In a heartbeat, `step` is the last completed optimizer step and `step_time` when it completed;
`time` is when the file was written. The training process rewrites it every HEARTBEAT_EVERY_S from a
thread that keeps running while the main thread waits in a collective, so a rank stuck behind a hung
peer keeps a fresh `time` and an old `step_time`; a frozen or dead rank (or a wedged node) stops
writing: its `time` goes stale. With lock-step data parallelism every rank's `step` stalls together,
so only `time` tells the culprit from its victims (`silent_ranks`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from contract import protocol

HEARTBEAT_EVERY_S = 5.0
# A rank whose heartbeat is older than this stopped writing it (missed 3 beats): frozen, dead or its
# node wedged. Small next to any sensible hang bound (minutes), large next to a file-system hiccup.
SILENT_AFTER_S = 3 * HEARTBEAT_EVERY_S


def identity() -> dict[str, Any]:
    """This training process as torchrun and SLURM name it (also the failure record's fields)."""
    env = os.environ
    return {"rank": int(env.get("RANK", "0")), "host": socket.gethostname(), "job": env.get("SLURM_JOB_ID", ""),
            "restart": int(env.get("SLURM_RESTART_COUNT", "0"))}


def roster_path(run_dir: Path) -> Path:
    return run_dir / protocol.LOGS_DIR / protocol.ROSTER_FILE


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return run_dir / protocol.LOGS_DIR / protocol.HEARTBEAT_DIR / f"rank-{rank:05d}.json"


def append_roster(run_dir: Path) -> dict[str, Any]:
    """Append this process's roster line; never raises (the roster is a diagnosis aid, not a need)."""
    env = os.environ
    ident = identity()
    record = {"time": time.time(), "rank": ident["rank"], "local_rank": int(env.get("LOCAL_RANK", "0")),
              "world": int(env.get("WORLD_SIZE", "1")), "host": ident["host"], "pid": os.getpid(),
              "job": ident["job"], "restart": ident["restart"]}
    append_jsonl(roster_path(run_dir), record)
    return record


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line; never raises (these logs are diagnosis aids: a full disk must not hide the
    real error). One short line per write: appends of several processes do not interleave."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError:
        pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of an append-only log, skipping a line cut by a crash (also failures.jsonl)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash
        if isinstance(record, dict):
            records.append(record)
    return records


def read_roster(run_dir: Path, job: str | None = None, restart: int | None = None) -> list[dict[str, Any]]:
    """Roster lines, oldest first; only those of one job and/or restart when given."""
    return [r for r in read_jsonl(roster_path(run_dir))
            if (job is None or r.get("job") == job) and (restart is None or r.get("restart") == restart)]


def write_heartbeat(run_dir: Path, step: int, step_time: float, ident: dict[str, Any] | None = None) -> None:
    """Rewrite this rank's heartbeat atomically; never raises (a slow or full disk must not stop training)."""
    ident = ident or identity()
    record = {**ident, "pid": os.getpid(), "step": step, "step_time": step_time, "time": time.time()}
    protocol.write_json_atomically(heartbeat_path(run_dir, ident["rank"]), record)


def read_heartbeats(run_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> its latest heartbeat record (files that cannot be read or parsed are skipped)."""
    beats: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / protocol.LOGS_DIR / protocol.HEARTBEAT_DIR).glob("rank-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int) and isinstance(record.get("time"), (int, float)):
            beats[record["rank"]] = record
    return beats


def silent_ranks(beats: dict[int, dict[str, Any]], now: float, older_than: float = SILENT_AFTER_S,
                 since: float = 0.0) -> list[int]:
    """Ranks whose heartbeat was last written more than `older_than` seconds before `now`.

    `since` (the attempt's start) drops beats of an earlier attempt: a rank that never wrote one in this
    attempt is silent too, when the caller lists it (see `missing_ranks`)."""
    return sorted(rank for rank, beat in beats.items() if beat["time"] >= since and now - beat["time"] > older_than)


def missing_ranks(beats: dict[int, dict[str, Any]], world: int, since: float = 0.0) -> list[int]:
    """Ranks of a world of `world` with no heartbeat written since `since` (never started, or died early)."""
    return [rank for rank in range(world) if rank not in beats or beats[rank]["time"] < since]
