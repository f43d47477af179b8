"""Imported by Python at start-up when tests/faults is on PYTHONPATH (see tests/faults/__init__.py).

Only training workers (torchrun sets RANK) with a fault variable set get hooks; everything else,
the sft-launch CLI included, starts untouched.
"""

import os

_STOP_AT = os.environ.get("SFT_FAULT_STOP_AT_STEP", "")
_SLOW_SAVE = os.environ.get("SFT_FAULT_SLOW_SAVE_STEP", "")
_RAISE_AT = os.environ.get("SFT_FAULT_RAISE_AT_STEP", "")

if "RANK" in os.environ and (_STOP_AT or _SLOW_SAVE or _RAISE_AT):
    import time
    from pathlib import Path

    from train.engine.hooks import HOOKS

    def _stop_at(step: int, is_main_process: bool, stop_file: Path) -> None:
        # The real file + all-reduce path at a deterministic step.
        if is_main_process and str(step) == _STOP_AT:
            stop_file.touch()

    def _slow_save(step: int) -> None:
        # Lets a test kill -9 the job in the middle of a save (temp dir written, not yet renamed).
        if str(step) == _SLOW_SAVE:
            time.sleep(600)

    def _raise_at(step: int, is_main_process: bool, stop_file: Path) -> None:
        # A bug every rank hits at the same step: no node is to blame, the job must not requeue.
        if str(step) == _RAISE_AT:
            raise RuntimeError(f"injected fault at step {step}")

    HOOKS.after_step = _raise_at if _RAISE_AT else _stop_at if _STOP_AT else None
    HOOKS.before_checkpoint_publish = _slow_save if _SLOW_SAVE else None
