"""A full disk fails loudly and leaves the previous checkpoint intact.

The disk is "full" through the file-size limit (RLIMIT_FSIZE) of the launched job: Python ignores
SIGXFSZ, so a write past the limit fails with EFBIG ("File too large", errno 27) — the same path
through save_state as ENOSPC, without mounting a small file system. The limit lets the logs and the
small per-rank RNG files through but not the model / optimizer files of the next checkpoint.
"""

from __future__ import annotations

import hashlib
import resource
import subprocess
from pathlib import Path

import pytest
from tests.train.run_helpers import REPO, launch_command, launch_env, read_log, run_training, write_run

from train.checkpoint import MARKER, PREFIX, complete_checkpoints, latest_checkpoint
from train.stop import TEST_STOP_AT_STEP_ENV

pytestmark = pytest.mark.slow

FILE_SIZE_LIMIT = 256 * 1024  # bytes: > logs and random_states_*.pkl (~15 kB), < model (~560 kB), optimizer (~1.1 MB)


def digests(directory: Path) -> dict[str, tuple[int, str]]:
    return {p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(directory.iterdir()) if p.is_file()}


def run_with_file_size_limit(run_dir: Path, limit: int, log_name: str, timeout: float = 240) -> int:
    def limit_file_size() -> None:  # in the child, before exec: inherited by torchrun and every rank
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with open(run_dir / log_name, "w") as log:
        proc = subprocess.run(launch_command(run_dir), cwd=REPO, env=launch_env(), stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout, preexec_fn=limit_file_size)
    return proc.returncode


def test_full_disk_fails_loudly_and_keeps_previous_checkpoint(tmp_path):
    run_dir = write_run(tmp_path / "run", {"train": {"max_steps": 12, "save_steps": 4}})
    ckpts = run_dir / "checkpoints"

    # Run 1: a stop request at step 4 leaves one complete checkpoint (exit 75, reported by torchrun as 1).
    run_training(run_dir, {TEST_STOP_AT_STEP_ENV: "4"}, log_name="first.log")
    previous = ckpts / f"{PREFIX}00000004"
    assert (previous / MARKER).is_file(), read_log(run_dir, "first.log")
    sizes = {p.name: p.stat().st_size for p in previous.iterdir()}
    assert max(sizes.values()) > FILE_SIZE_LIMIT, sizes  # the next save really cannot fit
    before = digests(previous)

    # Run 2: resumes from step 4, trains to step 8, and its save hits the "full disk".
    code = run_with_file_size_limit(run_dir, FILE_SIZE_LIMIT, "second.log")
    log = read_log(run_dir, "second.log")
    assert "resumed from" in log and "step-00000004 (step 4" in log, log
    # Loudly: non-zero exit (the rank's 1, passed on by torchrun), the OS error and its traceback in the log.
    assert code == 1, log
    assert "training failed" in log and "File too large" in log and "os error 27" in log, log
    assert "exitcode  : 1" in log, log  # the failing rank exited 1 itself (not 75, not killed)
    assert "checkpoint saved" not in log, log

    # Intact: the previous checkpoint is unchanged and still the one a restart resumes from.
    assert digests(previous) == before
    assert complete_checkpoints(ckpts) == [previous]
    assert latest_checkpoint(ckpts) == previous
    assert not (ckpts / f"{PREFIX}00000008").exists()  # never renamed: at most a .tmp-* left for cleanup
    assert not (run_dir / "export").exists()
