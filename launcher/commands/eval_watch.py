"""`sft-launch eval RUN --every-checkpoint`: evaluate each checkpoint as training writes it.

Evaluation during training without stalling it: this small login-node loop (no torch) watches
`checkpoints/` and, for every new complete checkpoint, starts a separate evaluation (the same
export-then-evaluate as `--checkpoint STEP`: a one-node SLURM job, or here with --executor local).
Training never waits for it. Because training prunes old checkpoints (save_total_limit) while an
eval job may still sit in the queue, the checkpoint is first pinned: hard-linked file by file into
`RUN/eval/pinned-step-N` (no copy of the data; the same filesystem), which the export removes once
it is done. Results: `RUN/eval/<name>-step-N.json`. The loop ends when the run has finished (after
one last look) or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from contract import protocol
from contract.schema import ConfigError
from launcher.ops import evalresults, rundir, status

POLL_S = 10.0
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "STOPPED")
CHECKPOINT_MARKER = protocol.CHECKPOINT_MARKER


def pin(checkpoint: Path, run_dir: Path, step: int) -> Path | None:
    """Hard-link the checkpoint's files under eval/; None when it was pruned before (or while) linking."""
    pinned = evalresults.results_dir(run_dir) / f"{evalresults.PINNED_PREFIX}{step:08d}"
    tmp = pinned.with_name(f".tmp-{pinned.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(checkpoint, tmp, copy_function=os.link)
    except (OSError, shutil.Error):
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    if not (tmp / CHECKPOINT_MARKER).is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    shutil.rmtree(pinned, ignore_errors=True)
    tmp.replace(pinned)
    return pinned


def run_finished(run_dir: Path) -> bool:
    current = status.run_status(run_dir)
    return bool(current["done"]) or str(current["state"]).startswith(FINISHED)


def watch(args: argparse.Namespace, start: Callable[[argparse.Namespace, Path | None], int],
          poll_s: float = POLL_S) -> int:
    """Call `start(args for STEP, pinned checkpoint or None)` once per new complete checkpoint."""
    run_dir = rundir.resolve_run(args)
    base = args.name or "every-checkpoint"
    seen: set[int] = {step for step, _ in rundir.complete_checkpoints(run_dir)
                      if (evalresults.results_dir(run_dir) / f"{base}-step-{step:08d}.json").is_file()}
    print(f"watching {run_dir / 'checkpoints'} (every {poll_s:g} s); Ctrl-C stops watching", flush=True)
    while True:
        finished = run_finished(run_dir)  # read before the scan: a checkpoint written meanwhile is still seen
        for step, path in rundir.complete_checkpoints(run_dir):
            if step in seen:
                continue
            seen.add(step)
            step_args = argparse.Namespace(**{**vars(args), "checkpoint": str(step),
                                              "name": f"{base}-step-{step:08d}", "every_checkpoint": False})
            exported = protocol.is_exported_model(evalresults.checkpoint_export_dir(run_dir, step))
            pinned = None if exported else pin(path, run_dir, step)
            if not exported and pinned is None:
                print(f"sft-launch: checkpoint step {step} was pruned before it could be pinned; skipped",
                      file=sys.stderr, flush=True)
                continue
            try:
                code = start(step_args, pinned)
            except (ConfigError, RuntimeError) as err:
                code = 2 if isinstance(err, ConfigError) else 1
                print(f"sft-launch: error: {err}", file=sys.stderr, flush=True)
            if code != 0:
                print(f"sft-launch: evaluation of step {step} failed (exit {code})", file=sys.stderr, flush=True)
        if finished:
            print("the run has finished; stopped watching")
            return 0
        time.sleep(poll_s)
