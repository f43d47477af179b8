"""Reading raw dataset rows, wherever a user keeps them: one file, a folder of shards, a saved
`datasets` folder, or a hub dataset in the Hugging Face cache (read offline).

Every row carries its location (`file:line` for JSON/JSONL/CSV; `file[row N]` for Parquet, saved
`datasets` folders and hub datasets; both 1-based) so a bad row is reported where the user can find it.

Splits of files and folders (`split_of`, documented in docs/data.md#splits): a file's name says which
split it holds, by these rules, the first that applies:
  1. a shard `SPLIT-00000-of-00003.parquet` (the hub's layout, `data/train-*.parquet`): SPLIT, whatever it is;
  2. a folder on its way that is the split asked for, or holds one split word (`train/part-0.jsonl`);
  3. a name that is the split asked for (`train_sft.jsonl` for split = "train_sft");
  4. a name holding one split word among its words (separated by `-`, `_`, `.`, spaces; trailing digits
     ignored): `train.jsonl`, `chats_test.jsonl`, `train_synthetic.jsonl`, `dev-01.jsonl`; two different
     split words (`train_test.jsonl`) are refused as ambiguous.
Split words: train, test, validation, valid, val, dev, eval. `data_files` picks a split's files; where the
names say nothing, only the default split ("train" = every row) exists, and asking for another is a
one-line error, never ignored. Hidden files and folders (a name starting with `.`, at any depth: editor
and notebook checkpoints, caches) are never data: skipped, and counted (`hidden_files`).
Torch-free; JSONL is read line by line (a multi-GB file never sits in memory). `contract.formats`
turns what these yield into examples; train and the launcher's check both read through here.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from contract.schema import ConfigError

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
DEFAULT_SPLIT = "train"  # of data that names no splits: all of it
SPLIT_WORDS = ("train", "test", "validation", "valid", "val", "dev", "eval")
_SHARD = re.compile(r"^(?P<split>.+?)-\d+-of-\d+")  # train_sft-00000-of-00001[-hash]
BINARY_SNIFF_BYTES = 8192  # the head of a JSON file searched for NUL bytes
SPLIT_HINT = "set the source's split (--data PATH:split=NAME, or split in a [[data.sources]] table)"
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark (Windows editors write one): not part of the data
OBJECT_SNIFF_MAX_BYTES = 256 << 20  # .json files up to this size starting with `{` are tried as one object


@dataclass
class RawRow:
    location: str  # "file:line" or "file[row N]"
    data: Any = None  # the decoded row (a dict when well-formed)
    error: str = ""  # why the row could not even be decoded (non-UTF-8, invalid JSON)
    offset: int = 0  # JSON/JSONL: bytes of the file read up to the end of this row (for progress)


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `datasets`' save_to_disk (a Dataset or a DatasetDict)."""
    return path.is_dir() and any((path / name).is_file() for name in ("state.json", "dataset_dict.json"))


def _is_hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def hidden_files(path: Path) -> int:
    """Files under a folder source skipped because they or a folder on their way are hidden."""
    if not path.is_dir() or is_saved_dataset(path):
        return 0
    return sum(1 for p in path.rglob("*") if p.is_file() and _is_hidden(p.relative_to(path)))


def shard_files(path: Path, key: str = "data.path") -> list[Path]:
    """The data files of a folder of shards, in name order (one format: the first file's suffix); hidden
    files and folders are skipped at any depth."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES
                   and not _is_hidden(p.relative_to(path)))
    if not files:
        raise ConfigError(f"{path}: no data files ({', '.join(DATA_SUFFIXES)}) in this folder", key)
    mixed = sorted({p.suffix for p in files})
    if len(mixed) > 1:
        raise ConfigError(f"{path}: a folder of shards holds one kind of file, found {', '.join(mixed)}", key)
    return files


def _split_words(stem: str) -> list[str]:
    """The split words among a name's words (rule 4 of the module doc), in order, without repeats."""
    words = [word.rstrip("0123456789") for word in re.split(r"[-_.\s]+", stem.lower())]
    return list(dict.fromkeys(word for word in words if word in SPLIT_WORDS))


def split_of(relative: Path, asked: str = "", key: str = "data.path") -> str | None:
    """The split a data file's name (relative to its source's folder) says it holds (the module doc's
    rules); None: it says none."""
    stem = relative.name
    for suffix in DATA_SUFFIXES:
        stem = stem.removesuffix(suffix)
    if shard := _SHARD.match(stem):
        return shard["split"]
    for part in relative.parent.parts:
        if part == asked or len(words := _split_words(part)) == 1:
            return asked if part == asked else words[0]
    if stem == asked:
        return asked
    words = _split_words(stem)
    if len(words) > 1:
        raise ConfigError(f"{key}: {relative}: its name holds two split words ({', '.join(words)}); rename it so "
                          "that it names one split", key)
    return words[0] if words else None


def data_files(path: Path, split: str = DEFAULT_SPLIT, key: str = "data.path", beside: bool = False) -> list[Path]:
    """The files of a file or folder source that hold `split` (see the module doc). `beside`: a single
    file's other split (eval_split) lies in the files next to it that name it."""
    beside = beside and path.is_file()
    if path.is_dir():
        files = shard_files(path, key)
        named = {file: split_of(file.relative_to(path), split, key) for file in files}
    elif beside:  # never the file itself, nor a hidden file: that is the training data, this never data
        files = sorted(p for p in path.parent.iterdir() if p.is_file() and p.suffix == path.suffix and p != path
                       and not p.name.startswith("."))
        named = {file: split_of(Path(file.name), split, key) for file in files}
    else:
        files, named = [path], {path: split_of(Path(path.name), split, key)}
    chosen = [file for file, name in named.items() if name == split]
    if chosen and (path.is_file() or None not in named.values()):
        return chosen
    if path.is_file() and not beside and split == DEFAULT_SPLIT:
        return [path]  # the file the user named, whole
    splits = sorted({name for name in named.values() if name})
    unnamed = [file for file, name in named.items() if not name]
    if splits and unnamed and chosen:
        raise ConfigError(f"{key}: {unnamed[0]}: its name says no split, while its folder's other files do "
                          f"({', '.join(splits)}); rename or move it", key)
    if not splits and split == DEFAULT_SPLIT:
        return files
    where = f"the files beside {path}" if beside else str(path)
    suffix = path.suffix or (files[0].suffix if files else ".jsonl")
    has = f"has {', '.join(splits)}" if splits else \
        f"no file names a split, as {split}-00000-of-00001{suffix}, {split}{suffix} or a {split}/ folder would"
    hint = f"; {SPLIT_HINT}" if split == DEFAULT_SPLIT else "; or use eval_path / eval_fraction" if beside else ""
    raise ConfigError(f"{key}: {where}: no split {split!r} ({has}){hint}", key)


def iter_rows(path: Path, split: str = DEFAULT_SPLIT, key: str = "data.path", beside: bool = False) -> Iterator[RawRow]:
    """Every row of a split of a JSON / JSONL / Parquet / CSV file, a folder of such shards, or a saved
    `datasets` folder (`data_files`; `beside`: a file's eval split in the files next to it)."""
    if is_saved_dataset(path):
        yield from _iter_saved_dataset(path, split, key)
    elif path.is_dir() or beside or split != DEFAULT_SPLIT:
        for file in data_files(path, split, key, beside):
            yield from _iter_file(file, key)
    else:
        yield from _iter_file(path, key)


def _iter_file(path: Path, key: str) -> Iterator[RawRow]:
    if path.suffix == ".parquet":
        yield from _iter_parquet(path)
    elif path.suffix == ".csv":
        yield from _iter_csv(path, key)
    elif path.suffix in (".jsonl", ".json"):
        with path.open("rb") as handle:
            head = handle.read(BINARY_SNIFF_BYTES)
            _refuse_binary(path, head, key)
            handle.seek(len(BOM) if head.startswith(BOM) else 0)
            first = head.removeprefix(BOM).lstrip()[:1]
            if first == b"[":
                yield from _iter_json_array(path, handle.read(), key)
            else:
                if first == b"{" and path.suffix == ".json":
                    _refuse_wrapped_rows(path, key)
                yield from _iter_jsonl(path, handle)
    else:
        raise ConfigError(f"{path}: unsupported data file (use .jsonl, .json, .parquet, .csv, a folder of them "
                          "or a saved datasets dir)", key)


def _refuse_binary(path: Path, head: bytes, key: str) -> None:
    """Binary garbage (a NUL byte never appears in UTF-8 JSON text) is one error, not a row error per line."""
    if b"\x00" in head:
        line = head.count(b"\n", 0, head.index(b"\x00")) + 1
        raise ConfigError(f"{path}:{line}: binary data (NUL byte), not JSON text; is this the right file?", key)


def _refuse_wrapped_rows(path: Path, key: str) -> None:
    """A .json file that is one object holding the rows under a key ({"version": 1, "data": [...]}) is
    refused naming that key, instead of a line-by-line "invalid JSON" (JSONL in a .json file reads on)."""
    if path.stat().st_size > OBJECT_SNIFF_MAX_BYTES:
        return
    try:
        whole = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return  # JSONL (several objects), or broken: read on, row by row
    rows = [name for name, value in whole.items() if isinstance(value, list) and value
            and all(isinstance(item, dict) for item in value)] if isinstance(whole, dict) else []
    if rows:
        raise ConfigError(f"{path}: one JSON object (keys {', '.join(sorted(whole))}) whose rows are the list under "
                          f"{rows[0]!r}: save that list as a JSON array or JSONL (e.g. python -c \"import json; "
                          f"json.dump(json.load(open('{path.name}'))['{rows[0]}'], open('rows.json', 'w'))\")", key)


def parse_jsonl_line(location: str, line: bytes, offset: int = 0) -> RawRow | None:
    """One JSONL line decoded (None for a blank line); undecodable lines carry their error."""
    if not line.strip():
        return None
    try:
        text = line.rstrip(b"\r\n").decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        return RawRow(location, error=f"not valid UTF-8 (byte {err.start})", offset=offset)
    try:
        return RawRow(location, json.loads(text), offset=offset)
    except json.JSONDecodeError as err:
        return RawRow(location, error=f"invalid JSON: {err.msg} (column {err.colno})", offset=offset)


def _iter_jsonl(path: Path, handle: BinaryIO) -> Iterator[RawRow]:
    offset = 0
    for number, line in enumerate(handle, start=1):
        offset += len(line)
        row = parse_jsonl_line(f"{path}:{number}", line, offset)
        if row is not None:
            yield row


def _iter_json_array(path: Path, raw: bytes, key: str) -> Iterator[RawRow]:
    """A JSON array of objects, decoded one element at a time so each row keeps its line number."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (a JSON array cannot skip one row)", key) from None
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = _skip_separators(text, pos)
        if pos >= len(text) or text[pos] == "]":
            return
        line = text.count("\n", 0, pos) + 1
        try:
            row, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{err.lineno}: invalid JSON: {err.msg}", key) from None
        yield RawRow(f"{path}:{line}", row, offset=len(raw) * pos // max(1, len(text)))


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
        pos += 1
    return pos


def _iter_csv(path: Path, key: str) -> Iterator[RawRow]:
    """A CSV file with a header row; every value is a string (empty cells are empty strings)."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {err.start})", key) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    line = 2  # the first record starts after the header
    try:
        for record in reader:
            if None in record:
                yield RawRow(f"{path}:{line}", error=f"{len(reader.fieldnames or [])} columns in the header, "
                                                      "more values in this record")
            else:
                yield RawRow(f"{path}:{line}", dict(record), offset=0)
            line = reader.line_num + 1
    except csv.Error as err:
        raise ConfigError(f"{path}:{reader.line_num}: {err}", key) from None


def _iter_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    index = 1
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield RawRow(f"{path}[row {index}]", without_struct_nulls(row))
            index += 1


def without_struct_nulls(row: Any) -> Any:
    """An Arrow row as the JSON it was written from: a struct column has the union of every row's keys, so a
    key one row lacks reads as null (tool arguments `{"location": "Osaka", "amount": null, "to": null}`).
    Nested objects lose their null keys; the row's own columns keep theirs (a null column is an absent one
    to contract/formats.py either way)."""
    if isinstance(row, dict):
        return {key: _strip(value) for key, value in row.items()}
    return row


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _strip(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_strip(item) for item in value]
    return value


def _pick_split(loaded: Any, split: str, where: str, key: str) -> Any:
    import datasets

    if not isinstance(loaded, datasets.DatasetDict):
        if split != DEFAULT_SPLIT:
            raise ConfigError(f"{key}: {where}: no split {split!r} (a saved Dataset without splits; save a DatasetDict, "
                              "or use eval_path / eval_fraction)", key)
        return loaded
    if split not in loaded:
        raise ConfigError(f"{key}: {where}: no split {split!r} (has {', '.join(sorted(loaded))}); {SPLIT_HINT}",
                          key)
    return loaded[split]


def _iter_saved_dataset(path: Path, split: str, key: str) -> Iterator[RawRow]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not a saved datasets directory (no dataset_info.json/state.json)", key) from None
    for index, row in enumerate(_pick_split(loaded, split, str(path), key), start=1):
        yield RawRow(f"{path}[row {index}]", without_struct_nulls(row))


def hub_datasets_cache(hf_home: str) -> Path:
    """Where `datasets` keeps prepared hub datasets: HF_DATASETS_CACHE, else <HF_HOME>/datasets."""
    if not hf_home and os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = hf_home or os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "datasets"


def hub_cache_folder(repo_id: str, hf_home: str) -> Path:
    """The folder `datasets` prepares a hub dataset in: <cache>/ORG___NAME, NAME in snake case (as its
    `camelcase_to_snakecase` writes it)."""
    *namespace, name = repo_id.split("/")
    snake = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)).lower()
    return hub_datasets_cache(hf_home) / "___".join([*namespace, snake])


def fetch_command(repo_id: str, config: str, split: str, hf_home: str) -> str:
    """The command that puts a hub dataset into the cache, on a machine with network."""
    args = ", ".join(repr(a) for a in (repo_id, *([config] if config else []))) + f", split={split!r}"
    home = f"HF_HOME={hf_home} " if hf_home else ""
    return f'{home}python -c "import datasets; datasets.load_dataset({args})"'


def open_hub_dataset(repo_id: str, config: str, split: str, hf_home: str, key: str) -> Any:
    """A hub dataset's split from the local cache only (the compute nodes have no network)."""
    import datasets

    datasets.config.HF_HUB_OFFLINE = True  # never reach for the network: read what the cache holds
    cache = hub_datasets_cache(hf_home)
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()  # "using the latest cached version": expected, not news
    try:
        return datasets.load_dataset(repo_id, config or None, split=split, cache_dir=str(cache))
    except (ConnectionError, FileNotFoundError) as err:
        if "not cached" not in str(err) and "Couldn't reach" not in str(err):
            raise
    except ValueError as err:
        message = str(err).splitlines()[0]
        if "split" in message.lower():
            raise ConfigError(f"{key} {repo_id}: {message}", key) from None
        if "config" in message.lower() or "Couldn't find cache" in message:
            raise ConfigError(f"{key} {repo_id}: config {config or 'default'!r} not in the cache ({cache}): "
                              f"{' '.join(str(err).split())}", key) from None
        raise
    finally:
        datasets.logging.set_verbosity(verbosity)
    raise ConfigError(f"{key} {repo_id}: not in the HF datasets cache ({cache}) and the hub is not read from here "
                      f"(offline); on a machine with network run: {fetch_command(repo_id, config, split, hf_home)} "
                      "and copy the cache over", key)


def iter_hub_rows(repo_id: str, config: str, split: str, hf_home: str, key: str) -> Iterator[RawRow]:
    for index, row in enumerate(open_hub_dataset(repo_id, config, split, hf_home, key), start=1):
        yield RawRow(f"{repo_id}[row {index}]", without_struct_nulls(row))
