"""Imported by Python at start-up when tests/faults is on PYTHONPATH (see tests/faults/__init__.py).

Only training workers (torchrun sets RANK) with a fault variable set get hooks; everything else,
the sft-launch CLI included, starts untouched.
"""

import os
import time

_STOP_AT = os.environ.get("SFT_FAULT_STOP_AT_STEP", "")
_SLOW_SAVE = os.environ.get("SFT_FAULT_SLOW_SAVE_STEP", "")
_SLOW_SAVE_S = float(os.environ.get("SFT_FAULT_SLOW_SAVE_S", "600"))
_RAISE_AT = os.environ.get("SFT_FAULT_RAISE_AT_STEP", "")
_SLOW_STOP_SAVE_S = os.environ.get("SFT_FAULT_SLOW_STOP_SAVE_S", "")
# Only the job's first start sleeps (a requeued start runs at full speed).
_STEP_SLEEP_S = os.environ.get("SFT_FAULT_STEP_SLEEP_S", "") if os.environ.get("SLURM_RESTART_COUNT", "0") in (
    "", "0") else ""

if "RANK" in os.environ and (_STOP_AT or _SLOW_SAVE or _RAISE_AT or _SLOW_STOP_SAVE_S or _STEP_SLEEP_S):
    from pathlib import Path

    from train.engine.hooks import HOOKS

    def _stop_at(step: int, is_main_process: bool, stop_file: Path) -> None:
        # The real file + all-reduce path at a deterministic step.
        if is_main_process and str(step) == _STOP_AT:
            stop_file.touch()

    def _slow_save(step: int) -> None:
        # Lets a test kill -9 the job in the middle of a save (temp dir written, not yet renamed), or stop it
        # (a stop request, a preemption) while an asynchronous save's write is in flight: the stall ends once
        # the stop file exists, as a write that was merely slow would end by itself.
        # Only a stop that comes during the stall ends it: a stop whose own save this is (its file already
        # there) stalls the whole time, for a test to act while that save hangs.
        deadline = time.monotonic() + _SLOW_SAVE_S
        stopped_before = bool(_stop_file) and _stop_file[0].exists()
        while str(step) == _SLOW_SAVE and time.monotonic() < deadline:
            if not stopped_before and _stop_file and _stop_file[0].exists():
                time.sleep(1.0)  # the rest of the write: the stop's step boundary finds it still in flight
                return
            time.sleep(0.1)

    def _raise_at(step: int, is_main_process: bool, stop_file: Path) -> None:
        # A bug every rank hits at the same step: no node is to blame, the job must not requeue.
        if str(step) == _RAISE_AT:
            raise RuntimeError(f"injected fault at step {step}")

    _stop_file: list[Path] = []  # the run's stop file, learnt at the first step boundary

    def _slow_stop_save(step: int) -> None:
        # The save that answers a stop request (preemption, time limit) takes this long, as a large
        # model's does: longer than torchrun's 30 s SIGTERM-to-SIGKILL default.
        if _stop_file and _stop_file[0].exists():
            time.sleep(float(_SLOW_STOP_SAVE_S))

    def _sleep_after_step(step: int, is_main_process: bool, stop_file: Path) -> None:
        # A step as slow as a real model's (a tiny CPU one takes ~50 ms): a preemption the test sends at some step
        # lands before the run has raced through the rest of its steps.
        time.sleep(float(_STEP_SLEEP_S))

    _after_step = (_raise_at if _RAISE_AT else _stop_at if _STOP_AT else _sleep_after_step if _STEP_SLEEP_S
                   else None)

    def _learn_stop_file(step: int, is_main_process: bool, stop_file: Path) -> None:
        _stop_file[:] = [stop_file]
        if _after_step is not None:
            _after_step(step, is_main_process, stop_file)

    HOOKS.after_step = _learn_stop_file if _SLOW_STOP_SAVE_S or _SLOW_SAVE else _after_step
    HOOKS.before_checkpoint_publish = (_slow_save if _SLOW_SAVE else _slow_stop_save if _SLOW_STOP_SAVE_S
                                       else None)

_KILL_IN_COPY = os.environ.get("SFT_FAULT_KILL_IN_COPY_STEP", "")
if "RANK" in os.environ and _KILL_IN_COPY:
    import signal

    from train.engine.hooks import HOOKS

    def _kill_in_copy(step: int, copied) -> None:
        # A save staged on node-local disk: rank 1 dies (SIGKILL, as on a lost node) once it copied its first
        # file of this step's save into the checkpoint's temp dir, the others' copies going on or done.
        if str(step) == _KILL_IN_COPY and os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)

    HOOKS.checkpoint_file_copied = _kill_in_copy

if "RANK" in os.environ and os.environ.get("SFT_FAULT_FP8_ON_CPU") == "1":
    # The one thing CI cannot show: an FP8 GPU. torch runs torch._scaled_mm on the CPU, so every other
    # part of an FP8 run (torchao's float8 linears, FSDP2, checkpoints, export) is the real one.
    import train.kernels.float8

    train.kernels.float8.unavailable = lambda device: None

_SLOW_EXPORT_S = os.environ.get("SFT_FAULT_SLOW_EXPORT_S", "")
if "RANK" in os.environ and _SLOW_EXPORT_S:
    import sys

    import train.engine.loop

    _export_model = train.engine.loop.export_model

    def _slow_export(*args, **kwargs):
        # The final export of a large model takes minutes: a preemption can land in it, after the last step's vote.
        print(f"fault: the export stalls {_SLOW_EXPORT_S} s", file=sys.stderr, flush=True)
        time.sleep(float(_SLOW_EXPORT_S))
        return _export_model(*args, **kwargs)

    train.engine.loop.export_model = _slow_export
