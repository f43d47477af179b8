"""How many training tokens a data file holds, estimated on the login node without a tokenizer.

The planner needs the token count for steps, ETA and GPU-hours, and loading a tokenizer (transformers)
would cost seconds. So, per row of the file (the formats contract/formats.py reads):
  * pre-tokenized rows (`input_ids`): exact length;
  * otherwise: characters of every string value / CHARS_PER_TOKEN, plus MESSAGE_OVERHEAD_TOKENS per
    chat message (role header, end-of-turn) and BOS/EOS; capped at model_max_length like train does.
CHARS_PER_TOKEN = 3.5 is a slightly pessimistic figure for English text with LLaMA-family BPE
vocabularies (32k-150k tokens: ~3.7-4.2 chars/token); code and non-English text run lower.
Files up to SAMPLE_BYTES are read completely; larger JSON/JSONL files are estimated from their
first SAMPLE_BYTES, scaled by file size (CSV likewise; a folder of shards sums its files). Parquet
files, saved `datasets` directories and hub datasets in the HF cache (Arrow files) are read with
pyarrow: their row count from the metadata, the rows of their first SAMPLE_BYTES (decoded batch by
batch, never the whole file) for the lengths, scaled to every row. Where pyarrow cannot read them,
uncompressed bytes / BYTES_PER_TOKEN. Anything else gives None: the plan then reports no step count.
Besides the tokens, each estimate keeps the longest row it read and how many rows are longer than
model_max_length (scaled like the rows): the plan names the documents train would cut.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.readers import DEFAULT_SPLIT, is_saved_dataset, shard_files

CHARS_PER_TOKEN = 3.5
MESSAGE_OVERHEAD_TOKENS = 6  # chat template: role header + end-of-turn markers per message
SEQUENCE_OVERHEAD_TOKENS = 2  # BOS + EOS
BYTES_PER_TOKEN = 4.0  # raw bytes per token for the fallbacks (includes field names, JSON quoting)
SAMPLE_BYTES = 4 * 1024 * 1024
SAMPLE_BATCH_ROWS = 256  # Parquet rows decoded at a time while sampling
SKIPPED_KEYS = frozenset({"id", "source", "from", "role"})  # metadata/role names the template replaces


@dataclass
class DataEstimate:
    tokens: int  # training tokens of the whole file after truncation to model_max_length
    rows: int
    method: str  # how it was obtained, shown in the plan
    exact_rows: bool  # False: extrapolated from a sample or from bytes
    longer: int = 0  # rows longer than model_max_length (train cuts them to it); scaled like `rows`
    longest: int = 0  # estimated tokens of the longest row read, before the cut
    lengths: str = ""  # how `longest` and `longer` were had: "chars/3.5 of all 300 rows", "... a sample of ..."

    @property
    def mean_tokens(self) -> float | None:
        return self.tokens / self.rows if self.rows else None


def holding_length(tokens: int) -> int:
    """The model_max_length that holds a `tokens`-long document whole: the next power of two (the micro-batch
    sizes the search tries)."""
    return 1 << max(0, tokens - 1).bit_length()


def _text_stats(value: Any, key: str = "") -> tuple[int, int]:
    """(characters of string leaves, chat messages) of one decoded row."""
    if isinstance(value, str):
        return (0 if key in SKIPPED_KEYS else len(value)), 0
    if isinstance(value, dict):
        stats = [_text_stats(v, k) for k, v in value.items()]
        return sum(c for c, _ in stats), sum(m for _, m in stats)
    if isinstance(value, list):
        stats = [_text_stats(v, key) for v in value]
        messages = sum(1 for v in value if isinstance(v, dict))
        return sum(c for c, _ in stats), messages + sum(m for _, m in stats)
    return 0, 0


def row_tokens(row: Any, max_length: int | None) -> int:
    """Estimated tokens of one row after truncation to `max_length` (None: before; exact for pre-tokenized
    `input_ids`)."""
    if isinstance(row, dict) and isinstance(row.get("input_ids"), list):
        tokens = len(row["input_ids"])
    else:
        chars, messages = _text_stats(row)
        tokens = math.ceil(chars / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD_TOKENS * messages + SEQUENCE_OVERHEAD_TOKENS
    return tokens if max_length is None else min(tokens, max_length)


def _from_rows(lengths: list[int], max_length: int, scale: float, method: str, exact: bool,
               rows: int | None = None) -> DataEstimate:
    """The estimate of rows of these (uncut) lengths, `scale` times as many in the whole file (`rows` of them,
    when known exactly)."""
    longer = sum(1 for n in lengths if n > max_length)
    total = int(len(lengths) * scale) if rows is None else rows
    read = f"all {len(lengths):,} rows" if len(lengths) >= total else \
        f"a sample: the first {len(lengths):,} of {'' if exact else '~'}{total:,} rows"
    return DataEstimate(int(sum(min(n, max_length) for n in lengths) * scale), total, method, exact,
                        longer=int(longer * scale), longest=max(lengths), lengths=f"chars/{CHARS_PER_TOKEN} of {read}")


def _json_rows(text: str, complete: bool) -> Iterator[Any]:
    """Decoded rows of a JSON array or JSONL text; a sample's cut-off last row is dropped."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        decoder, pos = json.JSONDecoder(), text.index("[") + 1
        while True:
            while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                return
            try:
                row, pos = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                return  # the sample ends mid-row (or the file is bad: train reports it with file:line)
            yield row
    lines = text.split("\n")
    for line in lines if complete else lines[:-1]:
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def _estimate_json(path: Path, size: int, max_length: int) -> DataEstimate | None:
    with path.open("rb") as handle:
        raw = handle.read(SAMPLE_BYTES)
    complete = size <= SAMPLE_BYTES
    text = raw.decode("utf-8", errors="ignore").removeprefix("\ufeff")
    counts = [row_tokens(row, None) for row in _json_rows(text, complete)]
    if not counts:
        return None
    if complete:
        return _from_rows(counts, max_length, 1.0, f"{len(counts)} rows read, chars/{CHARS_PER_TOKEN}", True)
    return _from_rows(counts, max_length, size / len(raw),
                      f"first {len(counts)} rows ({len(raw) >> 20} MiB) scaled to {size >> 20} MiB", False)


def estimate_bytes(uncompressed: int, rows: int, what: str) -> DataEstimate | None:
    """Tokens from uncompressed bytes (Parquet metadata, Arrow files); None for no bytes."""
    if uncompressed <= 0:
        return None
    return DataEstimate(int(uncompressed / BYTES_PER_TOKEN), rows, f"{what} bytes/{BYTES_PER_TOKEN:g}", False)


def _sample_lengths(batches: Iterator[Any]) -> list[int]:
    """Uncut token estimates of the rows of the first SAMPLE_BYTES (Arrow bytes) of these record batches."""
    lengths: list[int] = []
    read = 0
    for batch in batches:
        lengths += [row_tokens(row, None) for row in batch.to_pylist()]
        read += batch.nbytes
        if read >= SAMPLE_BYTES:
            break
    return lengths


def _from_sample(lengths: list[int], rows: int, max_length: int, what: str) -> DataEstimate | None:
    """A sample's lengths scaled to the `rows` the metadata counts (exactly)."""
    if not lengths or not rows:
        return None
    how = f"{what}: all {rows:,} rows read" if len(lengths) >= rows else \
        f"{what}: first {len(lengths):,} of {rows:,} rows"
    return _from_rows(lengths, max_length, rows / len(lengths), f"{how}, chars/{CHARS_PER_TOKEN}", True, rows)


def _estimate_parquet(path: Path, max_length: int) -> DataEstimate | None:
    import pyarrow.parquet as pq  # only for Parquet data (~0.2 s); the default path never imports it

    parquet = pq.ParquetFile(path)
    lengths = _sample_lengths(parquet.iter_batches(batch_size=SAMPLE_BATCH_ROWS))
    return _from_sample(lengths, parquet.metadata.num_rows, max_length, "Parquet")


def _arrow_batches(files: list[Path]) -> tuple[int, Iterator[Any]]:
    """(rows, record batches) of `datasets`' Arrow files (IPC streams, memory-mapped: counting the rows reads
    only the batches' headers)."""
    import pyarrow as pa

    readers = [pa.ipc.open_stream(pa.memory_map(str(file))) for file in files]
    batches = [batch for reader in readers for batch in reader]
    return sum(batch.num_rows for batch in batches), iter(batches)


def estimate_arrow(files: list[Path], max_length: int, what: str = "Arrow") -> DataEstimate | None:
    """A saved `datasets` folder's or a cached hub dataset's split, from its Arrow files; bytes / BYTES_PER_TOKEN
    where pyarrow cannot read them."""
    try:
        rows, batches = _arrow_batches(files)
        return _from_sample(_sample_lengths(batches), rows, max_length, what)
    except (ImportError, OSError, ValueError):
        return estimate_bytes(sum(file.stat().st_size for file in files), 0, what)


def _estimate_csv(path: Path, size: int, max_length: int) -> DataEstimate | None:
    """Like JSON: every string cell of the first SAMPLE_BYTES' records, scaled by file size."""
    with path.open("rb") as handle:
        raw = handle.read(SAMPLE_BYTES)
    lines = raw.decode("utf-8-sig", errors="ignore").splitlines()
    complete = size <= SAMPLE_BYTES
    counts = [row_tokens(row, None) for row in csv.DictReader(lines if complete else lines[:-1])]
    if not counts:
        return None
    scale = 1.0 if complete else size / len(raw)
    how = f"{len(counts)} CSV rows read, chars/{CHARS_PER_TOKEN}" if complete else \
        f"first {len(counts)} CSV rows scaled to {size >> 20} MiB"
    return _from_rows(counts, max_length, scale, how, complete)


def _estimate_shards(files: list[Path], max_length: int) -> DataEstimate | None:
    """A folder of shards: the sum of each file's estimate (None if any is unknown)."""
    parts = [estimate_tokens(file, max_length) for file in files]
    if not parts or any(part is None for part in parts):
        return None
    known = [part for part in parts if part is not None]
    sampled = ", a sample of each" if any("sample" in p.lengths for p in known) else ""
    return DataEstimate(sum(p.tokens for p in known), sum(p.rows for p in known),
                        f"{len(known)} shards, {known[0].method}", all(p.exact_rows for p in known),
                        longer=sum(p.longer for p in known), longest=max(p.longest for p in known),
                        lengths=f"chars/{CHARS_PER_TOKEN} of {len(known)} shards{sampled}")


def saved_split_files(path: Path, split: str) -> list[Path]:
    """The Arrow files of a saved `datasets` folder's split (a DatasetDict keeps one folder per split)."""
    folder = path / split if (path / "dataset_dict.json").is_file() else path
    return sorted(folder.glob("*.arrow"))


def estimate_tokens(path: Path, max_length: int, split: str = DEFAULT_SPLIT) -> DataEstimate | None:
    """Token estimate of a training data file, a folder of shards or a saved `datasets` directory; None when unknown."""
    try:
        if is_saved_dataset(path):
            return estimate_arrow(saved_split_files(path, split), max_length, "saved dataset")
        if path.is_dir():
            return _estimate_shards(shard_files(path), max_length)
        if path.suffix in (".json", ".jsonl"):
            return _estimate_json(path, path.stat().st_size, max_length)
        if path.suffix == ".csv":
            return _estimate_csv(path, path.stat().st_size, max_length)
        if path.suffix == ".parquet":
            return _estimate_parquet(path, max_length)
    except (OSError, ImportError, ValueError):
        return None  # unreadable here: the plan says "dataset size unknown"; train reports the real error
    return None
