"""Where the time from the job's start to the first optimizer step goes, one phase at a time (#53: a resume
at 8B on 4 GPUs should reach its first step within 60 s).

The clock starts at the earliest moment known: the attempt's start that the batch script or the local
executor exports (contract.protocol.JOB_START_ENV), else this process's own start (/proc/self/stat), else
the import of this module. Each `mark(phase)` closes the phase that ran since the previous mark; the
first step's end closes the last one, and rank 0 writes one `{"event": "startup", ...}` record to
metrics.jsonl (its console line names every phase). The phases, in order:

  launch           job start -> this process exists (the launcher's own start: accelerate, torchrun)
  imports          the interpreter and the heavy imports (torch, transformers, accelerate, datasets)
  process_group    the accelerator: the process group's rendezvous
  setup            seed, signal handlers, stale checkpoint clean-up, the newest checkpoint found
  data             tokenizer and datasets (a cache hit, or the tokenization)
  model_build      the model (from model.path, or on the meta device when the checkpoint has every weight)
  prepare          FSDP/DeepSpeed/DDP wrapping, the optimizer and scheduler
  checkpoint_load  the resume's load_state (0 on a fresh start)
  loop_setup       metrics sink, checkpointer, watchdog, the step's data
  first_step       the first optimizer step, its compile warm-up included (the device waited for)
"""

from __future__ import annotations

import os
import time
from typing import Any

from contract.protocol import JOB_START_ENV

IMPORTED_AT = time.time()  # the fall-back origin when neither the job's nor the process's start is known
PHASES = ("launch", "imports", "process_group", "setup", "data", "model_build", "prepare", "checkpoint_load",
          "loop_setup", "first_step")  # the record's phases, in this order (the module docstring says each)


def process_start_epoch() -> float | None:
    """When this process started (Linux: its start in clock ticks after boot, plus the boot time)."""
    try:
        with open("/proc/self/stat") as fh:
            # Field 22 (starttime); the command name (field 2) may hold spaces, so count after its ')'.
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def job_start_epoch(environ: dict[str, str] | os._Environ = os.environ) -> float | None:
    """The attempt's start as the batch script or the local executor exported it; None when absent or unreadable."""
    value = environ.get(JOB_START_ENV, "").replace(",", ".")  # $EPOCHREALTIME follows the locale's decimal point
    try:
        return float(value) if value else None
    except ValueError:
        return None


class StartupClock:
    """The startup phases of this process, each in seconds; `record()` once the first step is over."""

    def __init__(self) -> None:
        process = process_start_epoch()
        job = job_start_epoch()
        self.origin = "job" if job is not None else "process" if process is not None else "import"
        self.start = job if job is not None else process if process is not None else IMPORTED_AT
        self.phases: dict[str, float] = {}
        self._last = self.start
        if job is not None and process is not None:
            self._close("launch", min(max(process, job), time.time()))
        self.done = False

    def _close(self, phase: str, at: float) -> None:
        if phase not in PHASES:
            raise ValueError(f"startup phase {phase!r} is not one of {PHASES}")
        self.phases[phase] = self.phases.get(phase, 0.0) + max(0.0, at - self._last)
        self._last = max(self._last, at)

    def mark(self, phase: str) -> None:
        """`phase` ran from the previous mark (or the origin) until now."""
        self._close(phase, time.time())

    def record(self, step: int, resumed: bool) -> dict[str, Any]:
        """The metrics record, the first step closed now (the caller waited for the device). Every phase is
        in it (0 for one that did not run: `launch` without the job's start, `checkpoint_load` on a fresh start)."""
        self.mark("first_step")
        self.done = True
        return {"event": "startup", "step": step, "resumed": resumed, "origin": self.origin,
                "total_s": self._last - self.start, "phases": {name: self.phases.get(name, 0.0) for name in PHASES}}


def startup_line(record: dict[str, Any]) -> str:
    """The record's console line: the total and every phase, in order."""
    phases = ", ".join(f"{name} {seconds:.1f}" for name, seconds in record["phases"].items())
    start = "job start" if record["origin"] == "job" else "process start"
    kind = "resume" if record["resumed"] else "start"
    return f"startup ({kind}): {record['total_s']:.1f} s from {start} to the first step: {phases} (s)"
