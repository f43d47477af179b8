"""Checking a whole data file before anything waits in a queue: torch-free, on the login node.

Every row goes through `contract.formats.parse_row`, the very function the training side calls before
tokenizing, so a file that passes here cannot fail there on a row (only on the tokenizer's mask).
The scan streams (JSONL line by line) and reports progress in bytes. The result, rows, bad rows,
the first few problems with `file:line` and a SHA-256 of the content, is cached next to the data
(`.NAME.sft-check.json`, or under ~/.cache/sft-launch when that folder is read-only), keyed by the
files' size and mtime, so relaunching with an unchanged file does not read it again. Small files
are re-checked every time (faster than trusting a cache) and never leave a cache file behind.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from contract import protocol
from contract.formats import NO_MAPPING, BadRowError, RowMapping, detect_format, parse_row
from contract.overlap import HASH_BYTES, NO_HASH, row_hash
from contract.readers import (
    DEFAULT_SPLIT, RawRow, data_files, hidden_files, is_saved_dataset, iter_hub_rows, iter_rows, parse_jsonl_line,
)
from contract.schema import ConfigError
from contract.sources import DataSource

CHECK_VERSION = 4  # bump when parse_row's rules change, so cached verdicts are not reused
MAX_LISTED = 5  # problems kept individually; the rest are only counted
CACHE_MIN_BYTES = 1 << 20  # files below this are simply checked again
PROGRESS_EVERY_BYTES = 16 << 20
PARALLEL_MIN_BYTES = 64 << 20  # JSONL files at least this large are checked by several processes
CHUNK_BYTES = 16 << 20  # one worker task
MAX_WORKERS = 8  # a login node is shared: use a few cores, not all

Progress = Callable[[int, int], None]  # (bytes read, bytes in total)


@dataclass
class DataCheck:
    """What the check found in one data file (or saved `datasets` directory)."""

    path: str
    format: str  # as detected from the first decodable row when "auto" was asked for
    rows: int = 0
    bad_rows: int = 0
    sha256: str = ""  # of the file's bytes (of every file, in name order, for a directory)
    problems: list[str] = field(default_factory=list)  # first MAX_LISTED "file:line: reason"
    cached: bool = False
    name: str = ""  # the source's name (contract/sources.py); set by the caller
    eval: bool = False  # the source's own eval data (eval_path / eval_split)
    key: str = ""  # the flag or key that named it (--data, data.sources[1].path, ...)
    tool_rows: int = 0  # good rows whose conversation has tool calls or tool results
    first_tool_row: str = ""  # the location of the first of them (the template check renders it)
    files: list[str] = field(default_factory=list)  # the files read, relative to the source (a file alone: [])
    hidden: int = 0  # hidden files under a folder source, skipped
    unrenderable: int = 0  # good chat rows the model's template cannot render exactly (launcher/resolve/datarules.py)
    unrenderable_rows: list[str] = field(default_factory=list)  # the first MAX_LISTED of them, "location: reason"
    hashes: bytearray = field(default_factory=bytearray, repr=False)  # contract/overlap.py's row_hash of each
    # row in order (NO_HASH for a bad one): eval rows are compared with every source's training rows

    def row_hashes(self) -> list[bytes]:
        return [bytes(self.hashes[i:i + HASH_BYTES]) for i in range(0, len(self.hashes), HASH_BYTES)]

    def describe(self, allow_bad_rows: bool) -> str:
        """The plan's one-line account: rows, format, bad rows and what happens to them."""
        digest = f"sha256 {self.sha256[:12]}" if self.sha256 else "from the HF cache"
        text = f"{self.rows:,} rows checked ({self.format}), {digest}"
        if self.files:
            shown = ", ".join(self.files[:MAX_LISTED]) + (f", … ({len(self.files):,} files)"
                                                          if len(self.files) > MAX_LISTED else "")
            text += f"; read {shown}"
        if self.hidden:
            text += f"; {self.hidden:,} hidden file{'s' if self.hidden > 1 else ''} skipped"
        if self.unrenderable:
            text += (f"; {self.unrenderable:,} rows the chat template cannot render exactly, skipped "
                     f"(data.skip_unrenderable): {'; '.join(self.unrenderable_rows)}")
        if self.bad_rows:
            action = "skipped (data.allow_bad_rows)" if allow_bad_rows else "refused"
            text += f"; {self.bad_rows:,} bad, {action}; first: {self.problems[0]}"
        return text + (" [cached]" if self.cached else "")


@dataclass(frozen=True)
class LocalData:
    """A split of a local file, folder of shards or saved `datasets` folder (contract/readers.py's rules)."""

    path: Path
    split: str = DEFAULT_SPLIT
    key: str = "data.path"  # the key its errors name
    beside: bool = False  # a file's eval_split: in the files next to it

    def rows(self):  # type: ignore[no-untyped-def]
        return iter_rows(self.path, self.split, self.key, self.beside)

    def files(self) -> list[Path]:
        """What the data's bytes are: the split's files (a folder of several: all of its files)."""
        if is_saved_dataset(self.path):
            return _files(self.path)
        return data_files(self.path, self.split, self.key, self.beside)


def check_rows(check: DataCheck, source: DataSource, hf_home: str) -> Iterator[RawRow]:
    """The rows a check of `source` read again (its train split, or its eval data): file or hub id."""
    split = (source.eval_split or DEFAULT_SPLIT) if check.eval else source.split
    path = Path(check.path)
    if path.exists():
        return LocalData(path, split, beside=bool(check.eval and source.eval_split)).rows()
    return iter_hub_rows(check.path, source.config, split, hf_home, check.key)


def check_data(path: Path | LocalData, fmt: str = "auto", text_field: str = "text", progress: Progress | None = None,
               mapping: RowMapping = NO_MAPPING) -> DataCheck:
    """Check every row of `path` (cached by size/mtime); format errors raise ConfigError."""
    data = path if isinstance(path, LocalData) else LocalData(path)
    path = data.path
    key = _cache_key(data, fmt, text_field, mapping)
    cache = cache_file(data)
    if cache is not None:
        try:
            stored = json.loads(cache.read_text(encoding="utf-8"))
            if stored.get("key") == key:
                hashes = bytearray(base64.b64decode(stored["check"]["hashes"]))
                return DataCheck(**stored["check"] | {"cached": True, "hashes": hashes})
        except (OSError, ValueError, TypeError, KeyError):
            pass  # absent or unreadable: check again
    result = _scan(data, fmt, text_field, progress, mapping)
    result.files, result.hidden = _files_read(data), hidden_files(path)
    result.sha256 = content_sha256(path, data.files())
    if cache is not None:
        record = asdict(result) | {"hashes": base64.b64encode(result.hashes).decode()}
        _store(cache, {"key": key, "check": record})
    return result


def check_hub(repo_id: str, config: str, split: str, hf_home: str, key: str, fmt: str = "auto",
              text_field: str = "text", mapping: RowMapping = NO_MAPPING) -> DataCheck:
    """Every row of a hub dataset's split, read from the HF cache offline (not cached: the cache is the data)."""
    check = DataCheck(repo_id, fmt)
    for raw in iter_hub_rows(repo_id, config, split, hf_home, key):
        _check_row(check, raw, text_field, mapping)
    return check


def require_usable(check: DataCheck, allow_bad_rows: bool, key: str = "data.path") -> None:
    """Refuse (ConfigError naming the first bad row) unless every row is good or skipping was allowed."""
    if check.rows == 0:
        raise ConfigError(f"{check.path}: no rows (empty file)", key)
    if not check.bad_rows:
        return
    counts = f"{check.bad_rows:,} of {check.rows:,} rows bad"
    if check.bad_rows == check.rows:
        raise ConfigError(f"{check.problems[0]} (all rows bad: is this the right file or data.format?)", key)
    if not allow_bad_rows:
        raise ConfigError(f"{check.problems[0]} ({counts}; set data.allow_bad_rows = true to skip them)", key)


def _check_row(check: DataCheck, raw: RawRow, text_field: str, mapping: RowMapping) -> None:
    """One row through the training side's parser; the verdict is counted on `check`."""
    check.rows += 1
    if check.format == "auto" and not raw.error:
        check.format = detect_format(raw.data, text_field, raw.location, mapping)
    try:
        example = parse_row(raw, check.format, text_field, mapping)
    except BadRowError as err:
        check.bad_rows += 1
        check.hashes += NO_HASH
        if len(check.problems) < MAX_LISTED:
            check.problems.append(f"{raw.location}: {err}")
        return
    check.hashes += row_hash(example)
    if example.has_tool_calls:
        check.tool_rows += 1
        check.first_tool_row = check.first_tool_row or raw.location


def _scan(data: LocalData, fmt: str, text_field: str, progress: Progress | None,
          mapping: RowMapping = NO_MAPPING) -> DataCheck:
    path = data.path
    whole = data.split == DEFAULT_SPLIT and not data.beside
    if whole and path.suffix == ".jsonl" and path.is_file() and path.stat().st_size >= PARALLEL_MIN_BYTES \
            and _workers() > 1:
        return _scan_parallel(path, fmt, text_field, progress, mapping)
    check = DataCheck(str(path), fmt)
    total = sum(p.stat().st_size for p in data.files())
    reported = 0
    for raw in data.rows():
        _check_row(check, raw, text_field, mapping)
        if progress is not None and raw.offset - reported >= PROGRESS_EVERY_BYTES:
            reported = raw.offset
            progress(reported, total)
    if progress is not None and reported:
        progress(total, total)
    return check


def _files_read(data: LocalData) -> list[str]:
    """The files a local source's split was read from, relative to its folder ([]: the file named, alone)."""
    if is_saved_dataset(data.path):
        return []
    files = data.files()
    root = data.path if data.path.is_dir() else data.path.parent
    return [] if files == [data.path] else [str(file.relative_to(root)) for file in files]


def _workers() -> int:
    return min(MAX_WORKERS, len(os.sched_getaffinity(0)))


def _first_format(path: Path, fmt: str, text_field: str, mapping: RowMapping) -> str:
    """The format of the first decodable row (what the sequential scan and train detect)."""
    if fmt != "auto":
        return fmt
    for raw in iter_rows(path):
        if not raw.error:
            return detect_format(raw.data, text_field, raw.location, mapping)
    return fmt


def _line_chunks(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of about CHUNK_BYTES that start and end at line boundaries."""
    size, bounds = path.stat().st_size, [0]
    with path.open("rb") as handle:
        while bounds[-1] < size:
            handle.seek(min(bounds[-1] + CHUNK_BYTES, size))
            handle.readline()
            bounds.append(min(handle.tell(), size))
    return list(zip(bounds, bounds[1:]))


def _check_chunk(path: str, start: int, end: int, fmt: str, text_field: str,
                 mapping: RowMapping) -> tuple[int, DataCheck]:
    """(newlines, the verdict on its rows with locations "LINE-WITHIN-THE-CHUNK") of one byte range."""
    with open(path, "rb") as handle:
        handle.seek(start)
        data = handle.read(end - start)
    check = DataCheck(path, fmt)
    for number, line in enumerate(data.split(b"\n"), start=1):
        raw = parse_jsonl_line(str(number), line)
        if raw is not None:
            _check_row(check, raw, text_field, mapping)
    return data.count(b"\n"), check


def _scan_parallel(path: Path, fmt: str, text_field: str, progress: Progress | None,
                   mapping: RowMapping) -> DataCheck:
    """The same per-row check over line-aligned byte ranges in worker processes (JSON parsing and
    validation are CPU-bound: one core reads ~50 MB/s; a login node has many)."""
    from concurrent.futures import ProcessPoolExecutor

    check = DataCheck(str(path), _first_format(path, fmt, text_field, mapping))
    chunks = _line_chunks(path)
    with ProcessPoolExecutor(_workers()) as pool:
        futures = [pool.submit(_check_chunk, str(path), start, end, check.format, text_field, mapping)
                   for start, end in chunks]
        base = 0
        for (start, end), future in zip(chunks, futures):
            lines, part = future.result()
            check.rows, check.bad_rows = check.rows + part.rows, check.bad_rows + part.bad_rows
            check.hashes += part.hashes
            room = MAX_LISTED - len(check.problems)
            check.problems += [_shift(problem, path, base) for problem in part.problems[:room]]
            if part.tool_rows:
                check.tool_rows += part.tool_rows
                check.first_tool_row = check.first_tool_row or _shift(part.first_tool_row, path, base)
            base += lines
            if progress is not None:
                progress(end, chunks[-1][1])
    return check


def _shift(location: str, path: Path, base: int) -> str:
    """A chunk's "LINE[: reason]" as the file's "path:LINE[: reason]"."""
    number, sep, rest = location.partition(":")
    return f"{path}:{base + int(number)}{sep}{rest}"


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def content_sha256(path: Path, files: list[Path] | None = None) -> str:
    """SHA-256 of the data's bytes (a directory: every file's relative name and bytes, in order; `files`:
    those of the split read)."""
    digest = hashlib.sha256()
    for file in _files(path) if files is None else files:
        if file != path:
            digest.update(str(file.relative_to(path.parent if path.is_file() else path)).encode() + b"\0")
        with file.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def _cache_key(data: LocalData, fmt: str, text_field: str, mapping: RowMapping) -> str:
    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in data.files()]
    parts = {"version": CHECK_VERSION, "files": files, "format": fmt, "text_field": text_field,
             "mapping": asdict(mapping), "split": data.split, "beside": data.beside}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_file(data: Path | LocalData, kind: str = "sft-check") -> Path | None:
    """Where the verdict on `data` (of `kind`) is kept: next to it, else in the user's cache; None for small files."""
    data = data if isinstance(data, LocalData) else LocalData(data)
    if sum(p.stat().st_size for p in data.files()) < CACHE_MIN_BYTES:
        return None
    path = data.path.resolve()
    split = "" if data.split == DEFAULT_SPLIT and not data.beside else f".{data.split}"
    if os.access(path.parent, os.W_OK):
        return path.parent / f".{path.name}{split}.{kind}.json"
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sft-launch" / "data-checks"
    return root / f"{hashlib.sha256(f'{path}{split}.{kind}'.encode()).hexdigest()[:20]}.json"


def _store(cache: Path, record: dict) -> None:
    """Atomic write; a cache that cannot be written only costs a re-check next time."""
    protocol.write_json_atomically(cache, record)
