"""Each training rank's whole output in its own file; only local rank 0's progress on the console.

`python -m train --config RUN/train.toml --attempt NAME` (every executor passes NAME) points this
process's stdout and stderr, file descriptors included (C++ warnings, faulthandler, a traceback at
exit), at RUN/logs/ranks/NAME/rank-NNNNN.log. The console (the main log under SLURM, the terminal
locally) keeps local rank 0's log records below ERROR: the loss lines of rank 0, and one node's
facts per node. Errors end the run, and the launcher ends its output with the first failing rank's
first error line (contract/failure.py), so tracebacks and other ranks' follow-on errors are in the
rank logs only.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TextIO

from contract import protocol


def _below_error(record: logging.LogRecord) -> bool:
    return record.levelno < logging.ERROR


def redirect_output(run_dir: Path, attempt: str, rank: int, local_rank: int) -> TextIO | None:
    """Send fds 1 and 2 to this rank's log; return a stream on the former stdout for local rank 0."""
    directory = Path(protocol.rank_logs_dir(str(run_dir), attempt))
    directory.mkdir(parents=True, exist_ok=True)
    console = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8") if local_rank == 0 else None
    sys.stdout.flush()
    sys.stderr.flush()
    target = os.open(directory / protocol.rank_log_name(rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    sys.stdout.reconfigure(line_buffering=True)  # interleave with stderr in the order written
    return console


def console_handler(console: TextIO, formatter: logging.Formatter) -> logging.Handler:
    handler = logging.StreamHandler(console)
    handler.setFormatter(formatter)
    handler.addFilter(_below_error)
    return handler
