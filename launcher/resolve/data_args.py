"""`--data` on the command line -> the [data] table of train.toml.

    --data chats.jsonl                      one source: data.path, exactly as before
    --data chats.jsonl --data code.parquet:0.3
                                            [[data.sources]], each PATH[:WEIGHT] (weight: contract/sources.py)
    --data mix.toml                         a [data] table written by hand: [[data.sources]] with formats,
                                            column/role mappings, eval splits (relative paths: from its folder)
A path that exists is made absolute (the nodes start elsewhere); anything else that looks like
`org/name` (contract/sources.py's looks_like_hub_id) stays a hub dataset id, read from the profile's HF cache.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from contract.schema import ConfigError, read_utf8
from contract.sources import default_name, looks_like_hub_id, parse_data_flag, split_option
from launcher.resolve.profile import line_of_key

_SOURCE_KEY = re.compile(r"^data\.sources\[(\d+)\]\.?(\w*)")
_SOURCES_HEADER = re.compile(r"^\s*\[\[\s*data\s*\.\s*sources\s*\]\]")


def resolve_data_path(data: str, flag: str = "--data") -> str:
    path = Path(data).expanduser()
    if path.exists():
        return str(path.resolve())
    if looks_like_hub_id(data):
        return data  # a hub dataset id: preflight looks for it in the profile's HF cache
    raise ConfigError(f"{flag} {data}: no such file (nor a hub dataset id org/name)", flag)


def data_table(flags: list[str]) -> dict[str, Any]:
    """The [data] settings the --data flags ask for ({} when none)."""
    if not flags:
        return {}
    if any(flag.endswith(".toml") for flag in flags):
        if len(flags) > 1:
            raise ConfigError("--data FILE.toml: give the data file alone (list every source in it)", "--data")
        return _read_data_toml(Path(flags[0]).expanduser())
    splits = [split_option(flag) for flag in flags]  # PATH[:WEIGHT][:split=NAME]
    parsed = [(*parse_data_flag(flag), split) for flag, split in splits]
    if len(parsed) == 1 and parsed[0][1] is None and parsed[0][2] is None:
        return {"path": resolve_data_path(parsed[0][0])}  # one file: today's data.path
    sources, names = [], set()
    for path, weight, split in parsed:
        source: dict[str, Any] = {"path": resolve_data_path(path)}
        if weight is not None:
            source["weight"] = weight
        if split is not None:
            source["split"] = split
        name = default_name(path)
        if name in names:  # two shards both called train.jsonl: number them
            name = f"{name}-{len(sources)}"
            source["name"] = name
        names.add(name)
        sources.append(source)
    return {"sources": sources}


def _read_data_toml(path: Path) -> dict[str, Any]:
    """A TOML file with a [data] table (train.toml's, typically [[data.sources]]); paths from its folder."""
    try:
        document = tomllib.loads(read_utf8(path))
    except OSError as err:
        raise ConfigError(f"--data {path}: {err.strerror}", "--data") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--data {path}: {err}", "--data") from None
    table = document.get("data")
    if not isinstance(table, dict) or set(document) - {"data"}:
        raise ConfigError(f"--data {path}: expected only a [data] table (e.g. [[data.sources]] entries), "
                          f"found {sorted(document)}", "--data")
    try:
        return absolute_paths(table, path.parent)
    except ConfigError as err:
        raise at_line(err, path) from None


def data_toml(flags: list[str]) -> Path | None:
    """The data file `--data FILE.toml` names (data_table reads it), if that is how the data was given."""
    return Path(flags[0]).expanduser() if len(flags) == 1 and flags[0].endswith(".toml") else None


def at_line(err: ConfigError, path: Path) -> ConfigError:
    """`err` (naming a data.* key set in the --data TOML file `path`) with `path:LINE` in front, as the
    cluster file's errors have."""
    return ConfigError(f"{path}:{toml_line(read_utf8(path), err.key or '')}: {err}", err.key)


def toml_line(text: str, key: str) -> int:
    """1-based line where `key` (data.sources[N].name, data.path) is set in a data TOML file; best effort:
    the N-th [[data.sources]] header when the key is not on a line of its own (a sub-table, a default)."""
    match = _SOURCE_KEY.match(key)
    if not match:
        return line_of_key(text, [], key)
    lines = text.splitlines()
    headers = [index for index, line in enumerate(lines) if _SOURCES_HEADER.match(line)]
    if int(match[1]) >= len(headers):  # sources = [{...}, ...] written inline
        return line_of_key(text, ["data"], "sources")
    start = headers[int(match[1])]
    assignment = re.compile(rf"^\s*{re.escape(match[2])}\s*=") if match[2] else None
    for index in range(start + 1, len(lines)):
        if lines[index].lstrip().startswith("["):
            break
        if assignment and assignment.match(lines[index]):
            return index + 1
    return start + 1


def absolute_paths(table: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A [data] table whose local paths (data.path, eval_path, each source's) are absolute, taken from
    `folder` when relative: the nodes start elsewhere. Hub ids are left as they are."""
    for index, source in enumerate(table.get("sources") or []):
        for key in ("path", "eval_path", "tools"):
            if isinstance(source, dict) and isinstance(source.get(key), str) and source[key]:
                source[key] = _from_folder(folder, source[key], f"data.sources[{index}].{key}")
    for key in ("path", "eval_path"):
        if isinstance(table.get(key), str) and table[key]:
            table[key] = _from_folder(folder, table[key], f"data.{key}")
    return table


def _from_folder(folder: Path, value: str, key: str) -> str:
    candidate = (folder / Path(value).expanduser())
    if candidate.exists():
        return str(candidate.resolve())
    return resolve_data_path(value, key)
