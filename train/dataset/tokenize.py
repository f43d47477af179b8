"""Tokenizing one source's rows into the columns training reads (input_ids, labels, length), on every
core of the node.

The rows are read in order here (contract/readers.py) and handed out in blocks of BLOCK_ROWS to worker
processes, at most two blocks per worker in flight (memory stays bounded whatever the data's size);
the results are taken back in block order, so the dataset and its stats are exactly those of one
process (tests/train/test_sources.py). The workers are spawned, not forked: the caller holds
threads (accelerate, a process group) that a fork would copy mid-lock. Data of one block is tokenized
in this process, without a pool (starting one costs seconds).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from itertools import chain
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

from contract.config import TrainConfig
from contract.formats import BadRowError, detect_format, parse_row
from contract.overlap import row_hash
from contract.readers import RawRow
from contract.schema import ConfigError
from contract.sources import DataSource
from train.dataset.chat import IGNORE_INDEX, MaskError, has_generation_markers, tokenize_chat, tokenize_text

logger = logging.getLogger(__name__)

BLOCK_ROWS = 4096  # rows per worker task (and per Arrow chunk: bounds Python-list memory)
MAXED = frozenset({"longest_cut"})  # SplitStats fields combined by max, not summed
MAX_LISTED_SKIPS = 20  # skipped rows named individually in stats/logs; the rest only counted
FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "labels": datasets.List(datasets.Value("int32")),
        "length": datasets.Value("int32"),
        "row_hash": datasets.Value("int64"),  # contract/overlap.py's row_hash of its row: eval never trained
    }
)
Block = list[tuple[int, RawRow]]  # (row index in the source, the row)
Columns = dict[str, list]


@dataclass
class SplitStats:
    """What happened to the rows of one data file; `skipped` = every row not turned into an example."""

    path: str = ""
    format: str = ""
    rows: int = 0
    examples: int = 0
    skipped: int = 0
    skipped_bad_rows: int = 0
    skipped_mask: int = 0  # the assistant mask could not be computed (index reported)
    skipped_no_loss: int = 0  # nothing left to learn after truncation
    truncated: int = 0  # rows longer than model_max_length, cut to it
    longest_cut: int = 0  # tokens of the longest of them before the cut (a maximum, never a sum: MAXED)
    tokens: int = 0
    loss_tokens: int = 0
    skipped_examples: list[str] = field(default_factory=list)  # first few "row N (file:line): reason"
    cache_hit: bool = False

    def skip(self, kind: str, index: int, location: str, reason: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.skipped += 1
        if len(self.skipped_examples) < MAX_LISTED_SKIPS:
            self.skipped_examples.append(f"row {index} ({location}): {reason}")

    def add(self, part: SplitStats) -> None:
        """Count a later block's stats in (its listed skips logged here, where logging is set up)."""
        for item in fields(self):
            if item.type == "int":
                setattr(self, item.name, combined(item.name, [getattr(self, item.name), getattr(part, item.name)]))
        for line in part.skipped_examples[:MAX_LISTED_SKIPS - len(self.skipped_examples)]:
            self.skipped_examples.append(line)
            logger.warning("skipping %s", line)


def combined(name: str, values: list[int]) -> int:
    """Two blocks' or sources' SplitStats counts as one: summed, except a maximum (MAXED)."""
    return max(values) if name in MAXED else sum(values)


def tokenizing_workers() -> int:
    """The node's cores (this process's CPU affinity): only the local main process tokenizes, the others wait."""
    return len(os.sched_getaffinity(0))


def tokenize_input(rows: Iterable[RawRow], source: DataSource, where: str, key: str,
                   tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig, workers: int | None = None,
                   block_rows: int = BLOCK_ROWS, spill: Path | None = None) -> tuple[datasets.Dataset, SplitStats]:
    """Every usable row of one source's data tokenized and truncated; bad rows raise (or are counted).
    `spill`: an Arrow file the blocks are written to as they come (the result maps it), so a large source
    never sits in memory; None: in memory."""
    stats = SplitStats(path=where, format=source.format)
    job = RowTokenizer(tokenizer, cfg, source, has_generation_markers(tokenizer))
    if not job.use_markers:
        logger.info("chat template has no {%% generation %%} markers: assistant masks turn by turn")
    blocks = _blocks(rows, stats, source, where, block_rows)
    first, second = next(blocks, []), next(blocks, None)
    workers = tokenizing_workers() if workers is None else workers
    if second is None or workers < 2:
        results: Iterator[tuple[Columns, SplitStats]] = \
            (job.block(block, stats.format) for block in chain([first], [second] if second else [], blocks))
    else:
        logger.info("tokenizing %s in %d processes", where, workers)
        results = _in_pool(job, chain([first, second], blocks), stats, workers)
    with _Sink(spill) as sink:
        for columns, part in results:
            stats.add(part)
            sink.write(columns)
    if stats.examples == 0:
        first_skip = f"; first: {stats.skipped_examples[0]}" if stats.skipped_examples else ""
        raise ConfigError(f"{where}: no usable examples ({stats.rows} rows, {stats.skipped} skipped{first_skip})", key)
    logger.info(
        "%s: %d examples from %d rows (%d skipped, %d truncated), %d tokens, %d with loss",
        where, stats.examples, stats.rows, stats.skipped, stats.truncated, stats.tokens, stats.loss_tokens,
    )
    if stats.truncated:  # never a silent cut; the plan counted them before the queue (launcher/commands/plan_cmd.py)
        logger.warning("%s: %d document(s) longer than model_max_length %d cut to it (the longest %d tokens); keep "
                       "them whole with a larger train.model_max_length (or auto), split over GPUs with "
                       "--context_parallel", where, stats.truncated, cfg.train.model_max_length, stats.longest_cut)
    return sink.dataset(), stats


class _Sink:
    """Where tokenized blocks go: an Arrow stream file (memory-mapped after), or memory."""

    def __init__(self, path: Path | None):
        self.path, self.chunks, self.writer = path, [], None

    def __enter__(self) -> _Sink:
        if self.path is not None:
            import pyarrow as pa

            self.writer = pa.ipc.new_stream(str(self.path), FEATURES.arrow_schema)
        return self

    def write(self, columns: Columns) -> None:
        if self.writer is None:
            self.chunks.append(datasets.Dataset.from_dict(columns, features=FEATURES))
        else:
            import pyarrow as pa

            self.writer.write_batch(pa.RecordBatch.from_pydict(columns, schema=FEATURES.arrow_schema))

    def __exit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.writer.close()

    def dataset(self) -> datasets.Dataset:
        if self.path is None:
            return datasets.concatenate_datasets(self.chunks)
        return datasets.Dataset.from_file(str(self.path))


def _blocks(rows: Iterable[RawRow], stats: SplitStats, source: DataSource, where: str,
            size: int) -> Iterator[Block]:
    """The rows in blocks of `size`; the format is detected from the first decodable row, as it is read
    (so every block is tokenized with the format known when it is handed out)."""
    block: Block = []
    for index, raw in enumerate(rows):
        if stats.format == "auto" and not raw.error:
            stats.format = detect_format(raw.data, source.text_field, raw.location, source.mapping)
            logger.info("data format of %s: %s", where, stats.format)
        block.append((index, raw))
        if len(block) >= size:
            yield block
            block = []
    if block:
        yield block


def _in_pool(job: RowTokenizer, blocks: Iterator[Block], stats: SplitStats,
             workers: int) -> Iterator[tuple[Columns, SplitStats]]:
    """Each block's result, in order, from `workers` spawned processes; at most 2 blocks each in flight."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(job,))
    try:
        pending: deque[Future] = deque()
        for block in blocks:
            pending.append(pool.submit(_worker_block, block, stats.format))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # a bad row (raised from its block) drops the blocks not yet started
        pool.shutdown(wait=True, cancel_futures=True)


_JOB: RowTokenizer | None = None  # a worker process's tokenizer and settings (set once, by _start_worker)


def _start_worker(job: RowTokenizer) -> None:
    global _JOB
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per process: the processes are the parallelism
    _die_with_parent()
    _JOB = job


def _die_with_parent() -> None:
    """A training process killed while tokenizing (a preemption's SIGKILL) takes its workers with it (Linux)."""
    import ctypes
    import signal

    parent = multiprocessing.parent_process()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent is not None and not parent.is_alive():  # it died while this one was starting
        os._exit(1)


def _worker_block(block: Block, fmt: str) -> tuple[Columns, SplitStats]:
    assert _JOB is not None
    return _JOB.block(block, fmt)


@dataclass
class RowTokenizer:
    """What tokenizing a row needs; picklable, so a worker process gets its own."""

    tokenizer: PreTrainedTokenizerBase
    cfg: TrainConfig
    source: DataSource
    use_markers: bool

    def block(self, block: Block, fmt: str) -> tuple[Columns, SplitStats]:
        """The columns of a block's usable rows and what happened to its rows."""
        stats = SplitStats()
        columns: Columns = {"input_ids": [], "labels": [], "length": [], "row_hash": []}
        for index, raw in block:
            stats.rows += 1
            tokenized = self.row(raw, index, fmt, stats)
            if tokenized is not None:
                columns["input_ids"].append(tokenized[0])
                columns["labels"].append(tokenized[1])
                columns["length"].append(len(tokenized[0]))
                columns["row_hash"].append(tokenized[2])
        return columns, stats

    def row(self, raw: RawRow, index: int, fmt: str, stats: SplitStats) -> tuple[list[int], list[int], int] | None:
        """(input_ids, labels, its content's hash) of one row, truncated; None when the row is skipped (and
        counted)."""
        tokenizer, cfg, source, use_markers = self.tokenizer, self.cfg, self.source, self.use_markers
        try:
            example = parse_row(raw, fmt, source.text_field, source.mapping)
        except BadRowError as err:
            if not cfg.data.allow_bad_rows:
                raise ConfigError(f"{raw.location}: {err} (set data.allow_bad_rows = true to skip bad rows)") from None
            stats.skip("skipped_bad_rows", index, raw.location, str(err))
            return None
        try:
            if example.tokens is not None:
                input_ids, labels = example.tokens
            elif example.text is not None:
                input_ids, labels = tokenize_text(tokenizer, example.text)
            else:
                input_ids, labels = tokenize_chat(tokenizer, example.messages, use_markers, example.tools)
        except MaskError as err:
            if not cfg.data.skip_unrenderable:  # never dropped silently (the plan renders every row first)
                raise ConfigError(f"{raw.location}: assistant mask: {err} (set data.skip_unrenderable = true to "
                                  "skip such rows)") from None
            stats.skip("skipped_mask", index, raw.location, f"assistant mask: {err}")
            return None
        max_length = cfg.train.model_max_length
        if len(input_ids) > max_length:
            stats.truncated += 1
            stats.longest_cut = max(stats.longest_cut, len(input_ids))
            input_ids, labels = input_ids[:max_length], labels[:max_length]
        n_loss = sum(label != IGNORE_INDEX for label in labels[1:])  # label 0 is never predicted
        if n_loss == 0:
            stats.skip("skipped_no_loss", index, raw.location, "no loss token left after truncation")
            return None
        stats.examples += 1
        stats.tokens += len(input_ids)
        stats.loss_tokens += n_loss
        return input_ids, labels, int.from_bytes(row_hash(example), "little", signed=True)
