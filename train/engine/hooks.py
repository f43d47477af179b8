"""Fault-injection points the training loop exposes, for tests that drive it from the outside.

Production never sets them (both stay None). A test installs them in the worker processes before
`train.main` runs, e.g. from tests/faults/sitecustomize.py on the workers' PYTHONPATH, to request a
stop at a given step or to stall a checkpoint save while the test kills the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Hooks:
    # (step, is_main_process, stop_file): at every optimizer-step boundary, just before the ranks vote on stopping.
    after_step: Callable[[int, bool, Path], None] | None = None
    # (step): every rank, after a checkpoint's temp dir is fully written and before it is renamed and marked.
    before_checkpoint_publish: Callable[[int], None] | None = None
    # (step, file): every rank, after its background writer copied one file of a save staged on node-local disk
    # into the checkpoint's temp dir (train/persist/staging.py).
    checkpoint_file_copied: Callable[[int, Path], None] | None = None


HOOKS = Hooks()
