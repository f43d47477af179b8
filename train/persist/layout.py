"""The checkpoint directory's rules, torch-free: which folders are complete, how one becomes complete (fsync,
rename, COMPLETE marker), which are pruned, and what a save that found no room says.

Layout under ``run.checkpoint_dir``: ``.tmp-step-N/`` while it is written, ``step-N/`` once renamed, complete
only once it holds COMPLETE (written and fsynced after every file in it). A crash at any point leaves a
``.tmp-*`` dir (removed at the next start) or a renamed dir without COMPLETE (ignored, removed too); the
newest complete checkpoint is never pruned, nor any other for an incomplete one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

from contract import protocol
from contract.failure import PeerFailedError, first_line

logger = logging.getLogger(__name__)

MARKER = protocol.CHECKPOINT_MARKER
PREFIX = protocol.CHECKPOINT_PREFIX
TMP_PREFIX = protocol.CHECKPOINT_TMP_PREFIX
# A write that fails for want of room: a full disk, a quota, a file-size limit. By errno where the error
# keeps it, else by its words (safetensors says "os error 28"; torch's zip writer reports only the short
# write, "unexpected pos").
SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
SPACE_WORDS = ("no space left", "disk quota exceeded", "file too large", "unexpected pos",
               *(f"os error {code}" for code in SPACE_ERRNOS))


class CheckpointSpaceError(RuntimeError):
    """A checkpoint save ran out of room; the partial save is removed, the last complete one kept."""


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint dirs, oldest first."""
    if not root.is_dir():
        return []
    found = [(step, p) for p in root.iterdir()
             if (step := protocol.checkpoint_step(p)) is not None and (p / MARKER).is_file()]
    return [p for _, p in sorted(found, key=lambda found_step: found_step[0])]


def latest_checkpoint(root: Path) -> Path | None:
    done = complete_checkpoints(root)
    return done[-1] if done else None


def out_of_space(err: BaseException) -> bool:
    """Whether `err`, its causes, or (DCP) any rank's wrapped error is a write that found no room."""
    todo: list[object] = [err]
    seen: set[int] = set()
    while todo:
        exc = todo.pop()
        if not isinstance(exc, BaseException) or id(exc) in seen:
            continue
        seen.add(id(exc))
        text = str(exc).lower()
        if getattr(exc, "errno", None) in SPACE_ERRNOS or any(words in text for words in SPACE_WORDS):
            return True
        failures = getattr(exc, "failures", None)  # CheckpointException: rank -> (exception, traceback)
        wrapped = [f[0] if isinstance(f, tuple) else f for f in failures.values()] if isinstance(failures, dict) else []
        todo += [exc.__cause__, exc.__context__, *wrapped]
    return False


def space_error(root: Path, tmp: Path, err: BaseException) -> CheckpointSpaceError:
    """One line: where, how much room is left, how much a checkpoint needs, what was kept, what to do."""
    free = shutil.disk_usage(root).free
    previous = latest_checkpoint(root)
    if previous is None:
        kept, need = "no complete checkpoint exists yet", ""
    else:
        size = sum(f.stat().st_size for f in previous.rglob("*") if f.is_file())
        kept, need = f"{previous.name} is kept", f"; a checkpoint needs ~{size / 1e9:.3f} GB (as {previous.name})"
    return CheckpointSpaceError(
        f"checkpoint save to {tmp} ran out of room ({first_line(str(err))[:160]}): {free / 1e9:.3f} GB free "
        f"there{need}; the partial save was removed and {kept}: free space or lower train.save_total_limit, "
        "then run the same command to resume")


def write_json(path: Path, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


def publish(tmp: Path, final: Path) -> None:
    """fsync the files, rename, then write and fsync the marker: COMPLETE implies durable contents."""
    for path in tmp.rglob("*"):
        if path.is_file():
            _fsync_path(path)
    if final.exists():  # a complete save of the same step from an earlier incarnation
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_path(final.parent)
    marker = final / MARKER
    with open(marker, "w", encoding="utf-8") as fh:
        fh.write("ok\n")
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_path(final)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; the newest complete one is never removed."""
    done = complete_checkpoints(root)
    for old in done[: max(0, len(done) - max(1, keep))]:
        logger.info("pruning old checkpoint %s", old)
        shutil.rmtree(old)


def failed_save(root: Path, tmp: Path, err: BaseException) -> BaseException:
    """What a save that failed raises, once this rank removed what it could of `tmp` (before anyone records
    why: the failure records need room too): a CheckpointSpaceError when the write found no room; a
    PeerFailedError (a follow-on, contract/failure.py) when `tmp` is gone and the write failed for want of it: the
    rank whose own save failed removed it, and that rank's record is the cause; else `err`."""
    vanished = not tmp.exists() and _missing_path(err)
    shutil.rmtree(tmp, ignore_errors=True)
    if not isinstance(err, KeyboardInterrupt | SystemExit) and out_of_space(err):
        return space_error(root, tmp, err)
    if vanished:
        return PeerFailedError(f"checkpoint save to {tmp}: the folder was removed by another rank whose save failed "
                               f"({type(err).__name__}: {first_line(str(err))})")
    return err


def _missing_path(err: BaseException) -> bool:
    """A write that found its folder gone: FileNotFoundError, or torch.save's RuntimeError "Parent directory ... does
    not exist."."""
    return isinstance(err, FileNotFoundError) or (isinstance(err, RuntimeError) and "does not exist" in str(err))
