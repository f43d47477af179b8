"""Node-local staging of an asynchronous save (train.async_save_staging = "disk"): where it goes, and the copy.

When a node's RAM cannot hold its ranks' shards, a save of step N is staged on node-local storage instead: each
rank writes its shard there with DCP (every file fsynced: the training pause), and a background thread copies its
files into the shared ``.tmp-step-N`` and fsyncs each; the checkpoint becomes complete only as a memory-staged one
does (train/persist/layout.py: every rank's write over, then rename and COMPLETE). Each rank stages into a folder
of its own (DCP names its files by rank; rank 0 adds the metadata file), so the copies of all ranks together are
the DCP folder. A run killed at any point leaves a partial node-local folder (removed at the next start, on every
node, by `clear_local`) and a partial ``.tmp-step-N`` (remove_stale); neither is ever read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

COPY_CHUNK = 64 << 20  # bytes per read/write of the copy: large enough for NVMe and parallel filesystems
DISK_SHARE = 0.9  # of the node-local free space, what all ranks' staged shards may take


def node_local_root(configured: str) -> Path:
    """run.node_local_dir ($VARS expanded here, on the node); "" = $SLURM_TMPDIR (SLURM's per-job node-local
    folder, removed with the job), else the system's temp dir."""
    if configured:
        return Path(os.path.expandvars(configured))
    return Path(os.environ.get("SLURM_TMPDIR") or tempfile.gettempdir())


def run_staging_dir(local_root: Path, checkpoint_root: Path) -> Path:
    """This run's staging folder under `local_root`, named after its checkpoint directory: runs sharing a node
    never share one, and a restart of the run finds its predecessor's."""
    digest = hashlib.sha256(str(checkpoint_root.resolve()).encode()).hexdigest()[:16]
    return local_root / f"sft-launch-staging-{digest}"


def clear_local(staging: Path) -> None:
    """Remove what a killed run left in this node's staging folder (one rank per node calls it, then a barrier)."""
    if staging.exists():
        logger.warning("removing the partial node-local staging of an earlier run: %s", staging)
        shutil.rmtree(staging, ignore_errors=True)


def free_bytes(folder: Path) -> int:
    """Free bytes where `folder` is (or would be) created."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def copy_durable(source: Path, target: Path, on_file: Callable[[Path], None] | None = None) -> int:
    """Copy every file under `source` to the same place under `target`, each fsynced (and every folder made), then
    remove `source`; returns the bytes copied. `on_file` (the copied file) runs after each file."""
    copied = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as src, open(destination, "wb") as dst:
            while chunk := src.read(COPY_CHUNK):
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        copied += destination.stat().st_size
        if on_file is not None:
            on_file(destination)
    for folder in sorted({target, *(p.parent for p in target.rglob("*"))}):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    shutil.rmtree(source, ignore_errors=True)
    return copied
