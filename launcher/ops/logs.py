"""`sft-launch logs RUN [-f] [--restart N] [--node N | --rank N]`: the per-restart log, followed across requeues.

Each (re)start of a job writes logs/<jobid>-r<restart>.log (the batch shell redirects into it; the
submitit executor does the same). The default is the newest file; `-f` keeps printing what is
appended, switches to the next restart's file when it appears, and ends once the job has finished.

Node tagging: the template's srun has no --label, so lines carry no node prefix. Training lines
carry `[rank R]` (train/main.py's log format); R // processes-per-node is the node index
(SLURM_NODEID). srun's own lines name `task N` (one task per node). `--node N` keeps those two
kinds of lines for node N and drops untagged ones (batch-shell, torchrun and warning lines). The log
holds each node's local rank 0 only; `--rank N` prints rank N's whole output (tracebacks included)
from logs/ranks/<attempt>/ (contract.protocol): the attempt of the chosen restart, or for a local
run, which has no per-restart log, the newest attempt.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from contract import protocol
from launcher.ops import rundir, slurm, status
from launcher.usage import Parser

_RANK_TAG = re.compile(r"\[rank (\d+)\]")
_SRUN_TASK = re.compile(r"^srun: .*\btask (\d+)\b")
POLL_S = 0.5
STATE_EVERY_S = 2.0  # how often -f asks SLURM whether the job is over


def line_node(line: str, procs_per_node: int) -> int | None:
    """The node index a line came from, or None when the line does not say."""
    match = _RANK_TAG.search(line)
    if match:
        return int(match[1]) // max(1, procs_per_node)
    match = _SRUN_TASK.search(line)
    return int(match[1]) if match else None


def choose_log(logs: list[rundir.LogFile], restart: int | None) -> rundir.LogFile | None:
    """The newest file, or the newest one of restart `restart`."""
    candidates = [log for log in logs if restart is None or log.restart == restart]
    return candidates[-1] if candidates else None


class LineFilter:
    def __init__(self, node: int | None, procs_per_node: int, out: TextIO):
        self.node, self.procs_per_node, self.out = node, procs_per_node, out

    def emit(self, text: str) -> None:
        for line in text.splitlines(keepends=True):
            if self.node is None or line_node(line, self.procs_per_node) == self.node:
                self.out.write(line)
        self.out.flush()


def job_finished(run_dir: Path) -> bool:
    """True once the run's newest job is over: SLURM says so, or no longer knows it (then run.json
    holds the outcome), or no job was ever recorded."""
    current = status.run_status(run_dir)
    if current["state_source"] != "slurm":
        return current["state"] not in status.ACTIVE_STATES  # a local run: RUNNING while its launcher lives
    return current["state"] in slurm.FINISHED_STATES


def newest_log(run_dir: Path, job_ids: list[str]) -> rundir.LogFile | None:
    """The newest restart's log; a local run (no job ids) has none: rank 0's output of its newest attempt."""
    return choose_log(rundir.log_files(run_dir, job_ids), None) if job_ids else rundir.local_log(run_dir)


def follow(run_dir: Path, job_ids: list[str], lines: LineFilter, finished: Callable[[], bool],
           poll_s: float = POLL_S) -> None:
    """Print the newest log as it grows; switch to a newer restart's file; return when `finished()`."""
    current: rundir.LogFile | None = None
    position, pending = 0, b""
    next_check, done = 0.0, False
    while True:
        newest = newest_log(run_dir, job_ids)
        if newest is not None and newest != current:
            if current is not None:
                lines.emit(_text(pending + _read_from(current.path, position)))  # drain before switching
                pending = b""
                lines.out.write(f"==> {newest.path.name} (job {newest.job_id} restart {newest.restart}) <==\n")
            current, position = newest, 0
        if current is not None:
            chunk = _read_from(current.path, position)
            position += len(chunk)
            complete, newline, pending = (pending + chunk).rpartition(b"\n")
            if newline:
                lines.emit(_text(complete + newline))
        if done:
            lines.emit(_text(pending))
            return
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + STATE_EVERY_S
            done = finished()  # one more pass after this reads what was written last
        if not done:
            time.sleep(poll_s)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _read_from(path: Path, position: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            handle.seek(position)
            return handle.read()
    except FileNotFoundError:
        return b""


def rank_log(run_dir: Path, chosen: rundir.LogFile | None, rank: int) -> Path:
    """Rank `rank`'s log of the chosen restart's attempt (else of the newest attempt)."""
    ranks_dir = run_dir / protocol.LOGS_DIR / protocol.RANK_LOGS_DIR
    if chosen is not None:
        attempt = Path(protocol.rank_logs_dir(str(run_dir), protocol.attempt_name(chosen.job_id, chosen.restart)))
    else:
        attempts = sorted(ranks_dir.glob("*/"), key=lambda path: path.stat().st_mtime)
        if not attempts:
            raise RuntimeError(f"no rank logs in {ranks_dir} yet")
        attempt = attempts[-1]
    path = attempt / protocol.rank_log_name(rank)
    if not path.is_file():
        there = sorted(p.name for p in attempt.glob("*.log")) if attempt.is_dir() else []
        raise RuntimeError(f"no log of rank {rank} in {attempt} (there: {', '.join(there) or 'nothing'})")
    return path


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch logs", description="Print or follow a run's log.")
    rundir.add_run_arguments(parser)
    parser.add_argument("-f", "--follow", action="store_true", help="follow across requeues until the job ends")
    parser.add_argument("--restart", type=int, metavar="N", help="the log of restart N (default: the newest)")
    parser.add_argument("--node", type=int, metavar="N", help="only lines of node N (0 = first node)")
    parser.add_argument("--rank", type=int, metavar="N", help="rank N's whole output (its traceback included)")
    args = parser.parse_args(argv)
    if args.follow and args.restart is not None:
        parser.error("-f follows the newest restart; leave out --restart")
    if args.rank is not None and (args.follow or args.node is not None):
        parser.error("--rank prints one rank's log; leave out -f and --node")
    run_dir = rundir.resolve_run(args)
    run = rundir.read_run_json(run_dir)
    job_ids = [str(j) for j in run.get("job_ids", [])]
    lines = LineFilter(args.node, rundir.procs_per_node(run), sys.stdout)
    if args.follow:
        try:
            follow(run_dir, job_ids, lines, lambda: job_finished(run_dir))
        except slurm.SlurmUnavailable as err:
            raise RuntimeError(f"cannot tell when the job ends: {err}") from None
        return 0
    chosen = choose_log(rundir.log_files(run_dir, job_ids), args.restart)
    if chosen is None and not job_ids and args.restart is None and args.rank is None:
        chosen = rundir.local_log(run_dir)
    if args.rank is not None:
        sys.stdout.write(rank_log(run_dir, chosen, args.rank).read_text(encoding="utf-8", errors="replace"))
        return 0
    if chosen is None:
        which = f"restart {args.restart}" if args.restart is not None else "any restart"
        raise RuntimeError(f"no log of {which} in {run_dir / 'logs'} yet (job pending?)")
    lines.emit(chosen.path.read_text(encoding="utf-8", errors="replace"))
    return 0
