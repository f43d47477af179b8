"""Reading raw dataset rows and normalising the supported formats into chat messages or plain text.

Rows carry their location (`file:line`, 1-based, for JSON/JSONL; `file[row N]` for Parquet and
saved `datasets` directories) so a bad row is reported where the user can find it. Formats:
  sharegpt  {"conversations": [{"from": "system|human|gpt", "value": ...}, ...]}  (FastChat)
  messages  {"messages": [{"role": "system|user|assistant", "content": ...}, ...]}  (OpenAI)
  alpaca    {"instruction": ..., "input": ... (optional), "output": ..., "system": ... (optional)}
  text      {<text_field>: ...}  — loss on every token
  tokens    {"input_ids": [...], "labels": [...] (optional, -100 = no loss; absent = loss everywhere)}
            — pre-tokenized (benchmarks, or data tokenized elsewhere); used as is

One implementation for both sides: `train.dataset.load` tokenizes what `parse_row` returns, and the
launcher's pre-submission check (`contract.datacheck`) runs every row through the same `parse_row`
on the login node. Torch-free; JSONL is read line by line (a multi-GB file never sits in memory).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from contract.schema import ConfigError

FORMATS = ("sharegpt", "messages", "alpaca", "text", "tokens")
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
MESSAGE_ROLES = ("system", "user", "assistant")
BINARY_SNIFF_BYTES = 8192  # the head of a JSON file searched for NUL bytes


class BadRowError(ValueError):
    """A row that cannot be used; the message names its location."""


@dataclass
class RawRow:
    location: str  # "file:line" or "file[row N]"
    data: Any = None  # the decoded row (a dict when well-formed)
    error: str = ""  # why the row could not even be decoded (non-UTF-8, invalid JSON)
    offset: int = 0  # JSON/JSONL: bytes of the file read up to the end of this row (for progress)


@dataclass
class Example:
    """One normalised row: chat `messages` ({role, content}), plain `text`, or `tokens`; exactly one."""

    messages: list[dict[str, str]] | None = None
    text: str | None = None
    tokens: tuple[list[int], list[int]] | None = None  # (input_ids, labels), already tokenized


def iter_rows(path: Path) -> Iterator[RawRow]:
    """Every row of a JSON / JSONL / Parquet file or a saved `datasets` directory."""
    if path.is_dir():
        yield from _iter_saved_dataset(path)
    elif path.suffix == ".parquet":
        yield from _iter_parquet(path)
    elif path.suffix in (".jsonl", ".json"):
        with path.open("rb") as handle:
            head = handle.read(BINARY_SNIFF_BYTES)
            _refuse_binary(path, head)
            handle.seek(0)
            if head.lstrip()[:1] == b"[":
                yield from _iter_json_array(path, handle.read())
            else:
                yield from _iter_jsonl(path, handle)
    else:
        raise ConfigError(f"{path}: unsupported data file (use .jsonl, .json, .parquet or a saved datasets dir)",
                          "data.path")


def _refuse_binary(path: Path, head: bytes) -> None:
    """Binary garbage (a NUL byte never appears in UTF-8 JSON text) is one error, not a row error per line."""
    if b"\x00" in head:
        line = head.count(b"\n", 0, head.index(b"\x00")) + 1
        raise ConfigError(f"{path}:{line}: binary data (NUL byte), not JSON text; is this the right file?",
                          "data.path")


def parse_jsonl_line(location: str, line: bytes, offset: int = 0) -> RawRow | None:
    """One JSONL line decoded (None for a blank line); undecodable lines carry their error."""
    if not line.strip():
        return None
    try:
        text = line.rstrip(b"\r\n").decode("utf-8")
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


def _iter_json_array(path: Path, raw: bytes) -> Iterator[RawRow]:
    """A JSON array of objects, decoded one element at a time so each row keeps its line number."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (a JSON array cannot skip one row)", "data.path") from None
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
            raise ConfigError(f"{path}:{err.lineno}: invalid JSON: {err.msg}", "data.path") from None
        yield RawRow(f"{path}:{line}", row, offset=len(raw) * pos // max(1, len(text)))


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
        pos += 1
    return pos


def _iter_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield RawRow(f"{path}[row {index}]", row)
            index += 1


def _iter_saved_dataset(path: Path) -> Iterator[RawRow]:
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise ConfigError(f"{path}: not a saved datasets directory (no dataset_info.json/state.json)") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise ConfigError(f"{path}: saved DatasetDict has no 'train' split (has {sorted(loaded)})")
        loaded = loaded["train"]
    for index, row in enumerate(loaded):
        yield RawRow(f"{path}[row {index}]", row)


def detect_format(row: Any, text_field: str, location: str) -> str:
    """The format of a dataset, judged from its first row's keys."""
    if isinstance(row, dict):
        if "conversations" in row:
            return "sharegpt"
        if "messages" in row:
            return "messages"
        if "instruction" in row and "output" in row:
            return "alpaca"
        if text_field in row:
            return "text"
        if "input_ids" in row:
            return "tokens"
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ConfigError(
        f"{location}: cannot detect data.format from keys {keys}; expected 'conversations', 'messages', "
        f"'instruction'+'output' or the text field {text_field!r} (set data.format / data.text_field)",
        "data.format",
    )


def parse_row(raw: RawRow, fmt: str, text_field: str) -> Example:
    """A row as read (`iter_rows`) validated and normalised; raises BadRowError(reason).

    The one check both sides run: train before tokenizing, the launcher before submitting."""
    if raw.error:
        raise BadRowError(raw.error)
    return normalize(raw.data, fmt, text_field)


def normalize(row: Any, fmt: str, text_field: str) -> Example:
    """Validate one decoded row and turn it into an Example; raises BadRowError(reason)."""
    if not isinstance(row, dict):
        raise BadRowError(f"expected a JSON object, got {type(row).__name__}")
    if fmt == "text":
        return Example(text=_required_text(row, text_field))
    if fmt == "alpaca":
        return Example(messages=_alpaca_messages(row))
    if fmt == "tokens":
        return Example(tokens=_token_lists(row))
    if fmt == "sharegpt":
        turns = _required_list(row, "conversations")
        messages = [_sharegpt_turn(turn, i) for i, turn in enumerate(turns)]
    else:
        turns = _required_list(row, "messages")
        messages = [_openai_turn(turn, i) for i, turn in enumerate(turns)]
    _check_conversation(messages)
    return Example(messages=messages)


def _required_text(row: dict, key: str, allow_empty: bool = False) -> str:
    if key not in row or row[key] is None:
        raise BadRowError(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise BadRowError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise BadRowError(f"field {key!r} is empty")
    _check_encodable(value, key)
    return value


def _check_encodable(value: str, key: str) -> None:
    # JSON escapes can smuggle in lone surrogates ("\ud800") that no tokenizer can encode.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRowError(f"field {key!r} is not valid UTF-8 (lone surrogate)") from None


def _required_list(row: dict, key: str) -> list:
    value = row.get(key)
    if not isinstance(value, list) or not value:
        raise BadRowError(f"field {key!r} must be a non-empty list")
    return value


def _sharegpt_turn(turn: Any, index: int) -> dict[str, str]:
    if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
        raise BadRowError(f"conversations[{index}] needs 'from' and 'value'")
    role = SHAREGPT_ROLES.get(turn["from"])
    if role is None:
        raise BadRowError(f"conversations[{index}]: unknown role {turn['from']!r} (valid: system, human, gpt)")
    content = _required_text(turn, "value", allow_empty=role != "assistant")
    return {"role": role, "content": content}


def _openai_turn(turn: Any, index: int) -> dict[str, str]:
    if not isinstance(turn, dict) or "role" not in turn or "content" not in turn:
        raise BadRowError(f"messages[{index}] needs 'role' and 'content'")
    if turn["role"] not in MESSAGE_ROLES:
        raise BadRowError(f"messages[{index}]: unknown role {turn['role']!r} (valid: {', '.join(MESSAGE_ROLES)})")
    content = _required_text(turn, "content", allow_empty=turn["role"] != "assistant")
    return {"role": turn["role"], "content": content}


def _check_conversation(messages: list[dict[str, str]]) -> None:
    if any(m["role"] == "system" for m in messages[1:]):
        raise BadRowError("a system turn may only come first")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRowError("no assistant turn (nothing to learn)")


def _alpaca_messages(row: dict) -> list[dict[str, str]]:
    instruction = _required_text(row, "instruction")
    extra = _required_text(row, "input", allow_empty=True) if row.get("input") is not None else ""
    output = _required_text(row, "output")
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]
    if isinstance(row.get("system"), str) and row["system"].strip():
        messages.insert(0, {"role": "system", "content": _required_text(row, "system")})
    return messages


def _token_lists(row: dict) -> tuple[list[int], list[int]]:
    ids = row.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
        raise BadRowError("field 'input_ids' must be a non-empty list of token ids")
    labels = row.get("labels")
    if labels is None:
        return list(ids), list(ids)
    if not isinstance(labels, list) or len(labels) != len(ids) or not all(isinstance(t, int) for t in labels):
        raise BadRowError(f"field 'labels' must be a list of {len(ids)} ints (one per input id)")
    return list(ids), list(labels)
