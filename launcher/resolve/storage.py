"""Room on disk: what a run will write, against the free space where it writes it.

A run fills its file system hours in, when a checkpoint no longer fits: checked on the login node
instead. What it writes: checkpoints (the plan's size x (train.save_total_limit + 1): the newest K
kept plus the one being written before the oldest is pruned), the final export (bf16 weights; a LoRA
adapter alone unless merged) and the tokenized data cache. Each goes where the training config puts
it (relative paths inside the run directory); per file system, the bytes are compared with its free
space plus what the run already holds there (a resumed run's checkpoints and cache are replaced, not
added). Too little room is a ConfigError (exit 2) unless --force; under 20% to spare, a warning.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from contract.schema import ConfigError

EXPORT_BYTES_PER_PARAM = 2  # bf16 safetensors
CACHE_BYTES_PER_TOKEN = 16  # input_ids + labels as int64 in Arrow: an upper bound of the tokenized cache
MARGIN = 0.2  # warn when less than this fraction of the need would be left over


@dataclass(frozen=True)
class Filesystem:
    """What the run writes on one file system, and the room there."""

    mount: str
    needed: dict[str, int]  # bytes by what writes them ("checkpoints", "export", "cache")
    free: int  # free bytes now
    held: int  # bytes the run already holds there (replaced as it goes)

    @property
    def total(self) -> int:
        return sum(self.needed.values())

    @property
    def room(self) -> int:
        return self.free + self.held

    @property
    def fits(self) -> bool:
        """Room for all the run writes here; a launch refuses the run otherwise (unless --force)."""
        return self.total <= self.room

    def describe(self) -> str:
        parts = ", ".join(f"{name} {gb(size)}" for name, size in self.needed.items())
        return f"~{gb(self.total)} on {self.mount} ({parts}); {gb(self.room)} free"


def gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e7 else f"{size / 1e6:.1f} MB"


def mount_point(path: Path) -> Path:
    """The nearest existing parent's mount point: where the bytes will land."""
    path = path.expanduser().absolute()
    while not path.exists():
        path = path.parent
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


def bytes_under(path: Path) -> int:
    if not path.is_dir():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def run_writes(run_dir: Path, checkpoint_dir: str, export_dir: str, cache_dir: str,
               sizes: dict[str, int]) -> list[Filesystem]:
    """Group `sizes` (checkpoints, export, cache) by the file system their directory is on."""
    places = {"checkpoints": checkpoint_dir, "export": export_dir, "cache": cache_dir or "cache"}
    by_mount: dict[Path, dict[str, int]] = {}
    held: dict[Path, int] = {}
    for name, size in sizes.items():
        if not size:
            continue
        where = run_dir / Path(places[name]).expanduser()  # an absolute path replaces run_dir
        mount = mount_point(where)
        by_mount.setdefault(mount, {})[name] = size
        held[mount] = held.get(mount, 0) + bytes_under(where)
    return [Filesystem(str(mount), needed, shutil.disk_usage(mount).free, held[mount])
            for mount, needed in by_mount.items()]


WAYS_OUT = "free space, lower train.save_total_limit or choose another --output, or pass --force to launch anyway"


def room_warnings(filesystems: list[Filesystem]) -> list[str]:
    """One warning per file system that has room, but less than MARGIN to spare (no room: a refusal, `refusal`)."""
    return [f"disk: under 20% to spare: the run needs {fs.describe()}"
            for fs in filesystems if fs.fits and fs.room - fs.total < MARGIN * fs.total]


def require_room(filesystems: list[Filesystem]) -> None:
    """A ConfigError (exit 2) naming the file system, the bytes needed and the bytes free, when a need exceeds its room."""
    for fs in filesystems:
        if not fs.fits:
            raise ConfigError(f"disk: the run needs {fs.describe()} ({fs.total:,} bytes needed, {fs.room:,} free); "
                              f"{WAYS_OUT}", "--output")


def refusal(fs: Filesystem) -> str:
    """The plan's line for a file system without room: what a launch would refuse, and why."""
    return f"DOES NOT FIT: a launch would refuse it (exit 2): the run needs {fs.describe()}; {WAYS_OUT}"
