"""Fault injection from outside the production code: `sitecustomize.py` in this folder installs
`train.engine.hooks` callbacks in every training worker (a process with RANK set) that starts with this
folder first on PYTHONPATH, configured by the environment variables below (test-only names)."""

from __future__ import annotations

import os
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
STOP_AT_STEP_ENV = "SFT_FAULT_STOP_AT_STEP"  # rank 0 writes the stop file after this optimizer step
SLOW_SAVE_STEP_ENV = "SFT_FAULT_SLOW_SAVE_STEP"  # the save of this step stalls before its rename (in the writer)
SLOW_SAVE_S_ENV = "SFT_FAULT_SLOW_SAVE_S"  # ... for this many seconds (default 600), or until a stop is requested
RAISE_AT_STEP_ENV = "SFT_FAULT_RAISE_AT_STEP"  # every rank raises RuntimeError after this step (a code bug)
SLOW_STOP_SAVE_ENV = "SFT_FAULT_SLOW_STOP_SAVE_S"  # a save answering a stop request stalls this long
KILL_IN_COPY_STEP_ENV = "SFT_FAULT_KILL_IN_COPY_STEP"  # rank 1 SIGKILLs itself mid-copy of this step's disk-staged save
STEP_SLEEP_S_ENV = "SFT_FAULT_STEP_SLEEP_S"  # every optimizer step of a job's first start sleeps this long
SLOW_EXPORT_S_ENV = "SFT_FAULT_SLOW_EXPORT_S"  # the final export stalls this long before it starts
FP8_ON_CPU_ENV = "SFT_FAULT_FP8_ON_CPU"  # "1": train.precision = "fp8" runs on the CPU (no FP8 GPU here)


def fault_env(env: dict[str, str], **faults: float) -> dict[str, str]:
    """`env` with this folder first on PYTHONPATH and the faults set (stop_at_step=, slow_save_step=,
    slow_save_s=, raise_at_step=, slow_stop_save_s=, step_sleep_s=, slow_export_s=)."""
    names = {"stop_at_step": STOP_AT_STEP_ENV, "slow_save_step": SLOW_SAVE_STEP_ENV, "slow_save_s": SLOW_SAVE_S_ENV,
             "raise_at_step": RAISE_AT_STEP_ENV, "slow_stop_save_s": SLOW_STOP_SAVE_ENV,
             "step_sleep_s": STEP_SLEEP_S_ENV, "slow_export_s": SLOW_EXPORT_S_ENV}
    pythonpath = os.pathsep.join(filter(None, [str(FOLDER), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": pythonpath, **{names[key]: str(value) for key, value in faults.items()}}
