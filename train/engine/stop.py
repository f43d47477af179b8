"""Stop requests: turn "please stop" (a file, SIGUSR1, SIGTERM) into one flag every rank agrees on.

SLURM sends SIGUSR1 (``--signal=B:USR1@…``) to the batch shell, whose trap writes the stop file;
SIGTERM / SIGUSR1 may also reach the Python processes directly. A signal handler only sets a flag
(no I/O, no collectives inside a handler). At each optimizer-step boundary every rank calls
``StopRequest.agreed()``, which all-reduces the flag with MAX so that all ranks save and exit
together — a rank that saw the signal a moment later would otherwise deadlock the others.
"""

from __future__ import annotations

import logging
import signal
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from contract import protocol
from train.persist.snapshot import cpu_group

logger = logging.getLogger(__name__)


class StopRequest:
    def __init__(self, stop_file: Path, device: torch.device, timeout: timedelta | None = None):
        self.stop_file = stop_file
        self.device = device
        self.signalled: str | None = None
        self.group = cpu_group(timeout)  # the per-step votes' group (the stop's, a save's completion)

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def restore_default_handlers(self) -> None:
        """After the stop-save: torchrun SIGTERMs the other workers when the first exits non-zero;
        they must then die at once instead of waiting for torchrun's SIGKILL."""
        for signum in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signalled = signal.Signals(signum).name

    def clear_answered_file(self, is_main_process: bool, latest_checkpoint: Path | None) -> None:
        """Drop a stop file that a complete checkpoint already answered (the previous run saved
        after it), so a plain re-run resumes instead of stopping at once. A stop file newer than
        the newest complete checkpoint is a live request (e.g. SLURM's signal arrived while this
        run was starting up) and must stop this run at its first step boundary."""
        if not is_main_process or not self.stop_file.exists() or latest_checkpoint is None:
            return
        if protocol.answers_stop(latest_checkpoint, self.stop_file):
            logger.info("removing stop file answered by %s", latest_checkpoint.name)
            self.stop_file.unlink(missing_ok=True)

    def requested_locally(self) -> bool:
        return self.signalled is not None or self.stop_file.exists()

    def agreed(self, step: int, is_main_process: bool) -> bool:
        """True on every rank when any rank saw a stop request. Collective: call on all ranks."""
        local = self.requested_locally()
        if not (dist.is_available() and dist.is_initialized()):
            if local and is_main_process:
                self.stop_file.touch()
            return local
        # On the CPU (gloo): an all-reduce on the GPU stream would make every step wait for the GPU.
        flag = torch.tensor([1 if local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        agreed = bool(flag.item())
        if agreed and is_main_process and not self.stop_file.exists():
            # torchrun turns our exit 75 into its own exit 1; the launcher recovers 75 from "a
            # complete checkpoint newer than the stop file", so a signal-only stop writes the file too.
            self.stop_file.touch()
        if agreed:
            reason = self.signalled or (str(self.stop_file) if self.stop_file.exists() else "another rank")
            logger.info("stop requested (%s) at step %d", reason, step)
        return agreed



class Finished:
    """RUN/FINISHED (contract/protocol.py FINISHED_FILE): "this training is done", for the executors. A stop that
    comes after the last step's vote (a preemption during the export) is not answered by a checkpoint; the ranks
    finish instead, and torchrun's own exit code for the SIGTERM it got must not requeue a finished run."""

    def __init__(self, path: Path, is_main_process: bool):
        self.path = path
        self.is_main_process = is_main_process
        if is_main_process:
            path.unlink(missing_ok=True)  # a previous training's (this one may go on with more steps)

    def mark(self, step: int) -> None:
        if self.is_main_process:
            protocol.write_json_atomically(self.path, {"step": step})
            logger.info("finished at step %d (%s)", step, self.path.name)
