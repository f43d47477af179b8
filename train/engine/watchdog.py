"""The progress watchdog (#15): a rank that completes no optimizer step for too long exits EXIT_HUNG.

A dead or frozen node leaves its peers waiting inside a collective that nothing in Python can unwind
(the main thread is blocked in C++). A daemon thread therefore watches the time since the last
completed optimizer step; past the bound it logs who waited how long, dumps every thread's Python
stack to this rank's log, writes a failure record (exit 76, with the ranks whose heartbeats went
silent) and ends the process with ``os._exit``. The same thread rewrites this rank's heartbeat every
few seconds (contract/liveness.py), so a rank that is merely waiting stays visibly alive.

Bound = max(hang_timeout_s, STEP_MULTIPLE x the slowest of the recent step times). The first step
after start (compile, loading, warm-up) is not a sample: until a second step completes the floor
alone applies. Checkpoint saves and evaluations pause the watchdog (a 70B save takes minutes); a peer
that hangs during one is left to the collective timeout. hang_timeout_s = 0 turns the firing off
(heartbeats continue).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.failure import EXIT_HUNG, first_line, record_failure
from contract.liveness import HEARTBEAT_EVERY_S, identity, missing_ranks, read_heartbeats, silent_ranks, write_heartbeat

logger = logging.getLogger(__name__)

STEP_MULTIPLE = 10.0  # a step this many times slower than the slowest recent one is a hang
RECENT_STEPS = 20
CHECK_EVERY_S = 1.0
# The ranks of one attempt start within this of each other; older heartbeats are an earlier attempt's.
START_SKEW_S = 60.0


@dataclass
class ProgressBound:
    """When no progress has become a hang. Pure (times are passed in), so tests need no clock."""

    floor_s: float
    multiple: float = STEP_MULTIPLE
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    last_progress: float = 0.0
    last_step: int = 0
    paused: int = 0  # nesting depth of pause()
    _timing: bool = False  # the previous progress mark was a completed step, not the start

    def start(self, step: int, now: float) -> None:
        self.last_progress, self.last_step, self._timing = now, step, False

    def progress(self, step: int, now: float) -> None:
        if self._timing:
            self.recent.append(now - self.last_progress)
        self.last_progress, self.last_step, self._timing = now, step, True

    def pause(self) -> None:
        self.paused += 1

    def resume(self, now: float) -> None:
        """The wait restarts: the time spent saving or evaluating is not a step's."""
        self.paused = max(0, self.paused - 1)
        if not self.paused:
            self.last_progress = now

    def bound(self) -> float:
        return max(self.floor_s, self.multiple * max(self.recent)) if self.recent else self.floor_s

    def overdue(self, now: float) -> float | None:
        """Seconds waited when past the bound, else None (also when off or paused)."""
        if self.floor_s <= 0 or self.paused:
            return None
        waited = now - self.last_progress
        return waited if waited > self.bound() else None


class Watchdog:
    """The thread around a ProgressBound: heartbeats, and the exit when the bound is passed."""

    def __init__(self, run_dir: Path, hang_timeout_s: float):
        self.run_dir = run_dir
        self.progress_bound = ProgressBound(float(hang_timeout_s))
        self._ident = identity()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._step_time = time.time()
        self._started = time.time()
        self._thread = threading.Thread(target=self._run, name="sft-watchdog", daemon=True)

    def start(self, step: int) -> None:
        """Call once the model is ready, with the step training starts from (after a resume)."""
        with self._lock:
            self.progress_bound.start(step, time.monotonic())
        write_heartbeat(self.run_dir, step, self._step_time, self._ident)
        self._thread.start()

    def progress(self, step: int) -> None:
        """After each completed optimizer step (main thread; no I/O here, the thread writes)."""
        with self._lock:
            self.progress_bound.progress(step, time.monotonic())
            self._step_time = time.time()

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self.progress_bound.pause()
        try:
            yield
        finally:
            with self._lock:
                self.progress_bound.resume(time.monotonic())

    def close(self) -> None:
        """Stop the thread; the last heartbeat then names the last step (the thread's lag up to 5 s)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * CHECK_EVERY_S)
        with self._lock:
            step, step_time = self.progress_bound.last_step, self._step_time
        write_heartbeat(self.run_dir, step, step_time, self._ident)

    def _run(self) -> None:
        next_beat = time.monotonic() + HEARTBEAT_EVERY_S
        while not self._done.wait(CHECK_EVERY_S):
            now = time.monotonic()
            with self._lock:
                waited = self.progress_bound.overdue(now)
                step, step_time = self.progress_bound.last_step, self._step_time
            if now >= next_beat:
                write_heartbeat(self.run_dir, step, step_time, self._ident)
                next_beat = now + HEARTBEAT_EVERY_S
            if waited is not None:
                self._fire(waited, step)

    def _fire(self, waited: float, last_step: int) -> None:
        """Say who waited how long and where, dump all stacks, record exit 76, and end the process."""
        bound = self.progress_bound.bound()
        silent = silent_peers(self.run_dir, self._ident["rank"], self._started - START_SKEW_S)
        where = main_thread_frame()
        message = f"no progress for {waited:.0f} s after step {last_step} (hung collective?)"
        if silent:
            message += f"; silent ranks: {describe_ranks(silent)}"
        logger.error("rank %d on %s: %s; bound %.0f s; main thread in %s; stacks of all threads follow",
                     self._ident["rank"], self._ident["host"], message, bound, where)
        sys.stdout.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        hang = {"waited_s": round(waited, 1), "bound_s": round(bound, 1), "last_step": last_step,
                "silent_ranks": [beat["rank"] for beat in silent], "where": where}
        record_failure(self.run_dir, EXIT_HUNG, message, extra={"hang": hang})
        os._exit(EXIT_HUNG)  # the main thread is stuck in a collective: nothing else can unwind it


def silent_peers(run_dir: Path, rank: int, since: float) -> list[dict[str, Any]]:
    """The other ranks of this attempt that stopped writing heartbeats (or never wrote one): a rank's
    own is fresh while it waits, so these are the ones frozen, dead or on a wedged node."""
    beats = read_heartbeats(run_dir)
    ranks = set(silent_ranks(beats, time.time(), since=since))
    ranks |= set(missing_ranks(beats, int(os.environ.get("WORLD_SIZE", "1")), since))
    return [beats.get(r) or {"rank": r, "host": None} for r in sorted(ranks - {rank})]


def describe_ranks(beats: list[dict[str, Any]]) -> str:
    return ", ".join(f"{b['rank']} ({b.get('host') or 'no heartbeat'})" for b in beats)


def main_thread_frame() -> str:
    """The innermost Python frame of the main thread, and the innermost one of our train package."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return "unknown"
    stack = traceback.extract_stack(frame)
    ours = [f for f in stack if f"{os.sep}train{os.sep}" in f.filename]
    shown = [stack[-1]] + ([ours[-1]] if ours and ours[-1] is not stack[-1] else [])
    return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in shown)


# What a collective that gave up looks like: torch's DistBackendError (NCCL, gloo), or gloo's plain
# RuntimeError when the peer's socket closed (SIGKILL, node gone) or its receive timed out.
_COLLECTIVE_ERROR_TYPES = {"DistBackendError", "DistNetworkError", "DistStoreError"}
_COLLECTIVE_MESSAGES = re.compile(
    r"timed out|timeout|connection (closed|reset|refused)|closed by peer|broken pipe|peer .*(died|gone)", re.I)


def collective_failure(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    return bool(names & _COLLECTIVE_ERROR_TYPES) or (
        isinstance(err, RuntimeError) and bool(_COLLECTIVE_MESSAGES.search(str(err))))


def record_collective_failure(run_dir: Path, err: BaseException, started: float) -> None:
    """A collective gave up (timeout, or a peer's connection closed): exit 76 with the silent peers.
    `started`: when this process started (time.time()), to skip an earlier attempt's heartbeats."""
    ident = identity()
    silent = silent_peers(run_dir, ident["rank"], started - START_SKEW_S)
    message = f"collective failed (a peer died or hung?): {type(err).__name__}: {first_line(str(err))}"
    if silent:
        message += f"; silent ranks: {describe_ranks(silent)}"
    logger.error("rank %d on %s: %s", ident["rank"], ident["host"], message)
    record_failure(run_dir, EXIT_HUNG, message,
                   extra={"hang": {"collective": True, "silent_ranks": [b["rank"] for b in silent]}})
