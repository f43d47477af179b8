"""Real file systems of a chosen size for the disk-space tests: a tmpfs mount (root only).

A tmpfs size is a limit, not an allocation: a "2 PB" tmpfs holds a 70B run's rendered files and reports
the room its checkpoints would need, and a few-MB one fills up for real (ENOSPC) mid-save.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOMY = "2000000g"  # as much room as a cluster's parallel file system


@contextmanager
def tmpfs(mount_point: Path, size: str) -> Iterator[Callable[[int | str], None]]:
    """Mount a tmpfs of `size` at `mount_point`; yields `resize(new_size)`; unmounts afterwards."""
    if os.geteuid() != 0:
        raise PermissionError("the disk-space tests mount a tmpfs: run the suite as root (CI does)")
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)

    def resize(new_size: int | str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new_size}", str(mount_point)], check=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
