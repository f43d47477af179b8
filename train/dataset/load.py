"""Tokenizer loading and the tokenized train/eval datasets (train.dataset.load in docs/ARCHITECTURE.md).

`build_datasets` reads the data file(s), normalises every row (contract.formats), tokenizes it with
loss only on assistant tokens (train.dataset.chat), truncates to `train.model_max_length`, and caches the
result with `datasets.save_to_disk` under `data.cache_dir` (default RUN_DIR/cache). The cache key
hashes the data files' path/size/mtime, the tokenizer (vocabulary, merges, specials, chat
template), the max length and the format, so a requeued job loads the cache instead of
re-tokenizing. A cache entry appears atomically (written to a temp dir, then renamed), so a job
killed while tokenizing never leaves a half-written cache behind.

Distributed use: only the local main process tokenizes; the others wait and then read the cache:
    build_datasets(cfg, tok, is_main=accelerator.is_local_main_process,
                   barrier=accelerator.wait_for_everyone)
Every process calls `barrier` exactly once. With a cache dir shared between nodes, two nodes may
both tokenize on a first run; the first rename wins and the other copy is dropped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from contract.config import SHIPPED_ASSETS, SHIPPED_DATA, TrainConfig
from contract.failure import PeerFailedError
from contract.formats import BadRowError, RawRow, detect_format, iter_rows, parse_row
from contract.schema import ConfigError
from train.dataset.chat import IGNORE_INDEX, MaskError, has_generation_markers, tokenize_chat, tokenize_text

logger = logging.getLogger(__name__)

SHIPPED_TOKENIZER = SHIPPED_ASSETS / "tiny-tokenizer"
CACHE_VERSION = 2  # bump when tokenization/masking changes so old caches are not reused
CHUNK_EXAMPLES = 8192  # examples per Arrow chunk while tokenizing (bounds Python-list memory)
MAX_LISTED_SKIPS = 20  # skipped rows named individually in stats/logs; the rest only counted
FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "labels": datasets.List(datasets.Value("int32")),
        "length": datasets.Value("int32"),
    }
)


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
    truncated: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    skipped_examples: list[str] = field(default_factory=list)  # first few "row N (file:line): reason"
    cache_hit: bool = False

    def skip(self, kind: str, index: int, location: str, reason: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        self.skipped += 1
        if len(self.skipped_examples) < MAX_LISTED_SKIPS:
            self.skipped_examples.append(f"row {index} ({location}): {reason}")
            logger.warning("skipping row %d (%s): %s", index, location, reason)


@dataclass
class DataBundle:
    train: datasets.Dataset  # columns input_ids, labels (-100 = no loss), length
    eval: datasets.Dataset | None
    stats: dict[str, Any]  # train split's SplitStats fields, plus "eval": {...} and eval_examples


def load_tokenizer(cfg: TrainConfig) -> PreTrainedTokenizerBase:
    """model.tokenizer, else model.path, else the shipped tiny tokenizer; local files only."""
    source = cfg.model.tokenizer or cfg.model.path
    key = "model.tokenizer" if cfg.model.tokenizer else "model.path"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source or str(SHIPPED_TOKENIZER), local_files_only=True)
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"{key}: cannot load a tokenizer from {source!r}: {first_line}", key) from None
    if tokenizer.pad_token is None:
        # Packed batches never pad; padded batches need some id, and its labels are -100 anyway.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def resolve_data_path(cfg: TrainConfig, value: str, key: str) -> Path:
    """A data path as given (absolute or relative to the working dir), else relative to run.dir."""
    for candidate in (Path(value), cfg.run.resolve(value)):
        if candidate.exists():
            return candidate.resolve()
    raise ConfigError(f"{key}: {value!r} does not exist (relative paths: working dir or run.dir)", key)


def build_datasets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    is_main: bool = True,
    barrier: Callable[[], Any] | None = None,
) -> DataBundle:
    """Tokenized train (and eval) datasets, from the cache when it is there. See the module doc."""
    paths = {"train": resolve_data_path(cfg, cfg.data.path, "data.path") if cfg.data.path else SHIPPED_DATA}
    if cfg.data.eval_path:
        paths["eval"] = resolve_data_path(cfg, cfg.data.eval_path, "data.eval_path")
    cache_root = cfg.run.resolve(cfg.data.cache_dir or "cache")
    entries = {name: cache_root / f"tokenized-{cache_key(path, tokenizer, cfg)}" for name, path in paths.items()}
    if is_main:
        try:
            loaded = {name: _load_or_tokenize(paths[name], entries[name], tokenizer, cfg) for name in paths}
        finally:  # release the waiting processes even on failure, so they fail fast instead of hanging
            if barrier is not None:
                barrier()
    else:
        if barrier is not None:
            barrier()
        loaded = {name: _load_cached(entries[name]) for name in paths}
    train, train_stats = loaded["train"]
    if "eval" in loaded:
        eval_set, eval_stats = loaded["eval"]
    else:
        train, eval_set = split_eval(train, cfg.data.eval_fraction, cfg.train.seed)
        eval_stats = None
    stats = {**asdict(train_stats), "eval": asdict(eval_stats) if eval_stats else None}
    stats["eval_examples"] = len(eval_set) if eval_set is not None else 0
    stats["train_examples"] = len(train)
    return DataBundle(train=train, eval=eval_set, stats=stats)


def split_eval(
    dataset: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """A deterministic (by seed) eval split of `fraction` of the examples; at least one each side."""
    if fraction <= 0 or len(dataset) < 2:
        return dataset, None
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(dataset))
    n_eval = min(max(1, round(len(dataset) * fraction)), len(dataset) - 1)
    eval_idx, train_idx = sorted(order[:n_eval].tolist()), sorted(order[n_eval:].tolist())
    return dataset.select(train_idx), dataset.select(eval_idx)


def cache_key(path: Path, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> str:
    """Hash of everything that changes the tokenized result (not the file contents: stats suffice)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    parts = {
        "version": CACHE_VERSION,
        "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files],
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_length": cfg.train.model_max_length,
        "format": cfg.data.format,
        "text_field": cfg.data.text_field,
        "allow_bad_rows": cfg.data.allow_bad_rows,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    extra = json.dumps([tokenizer.chat_template, str(tokenizer.special_tokens_map)], sort_keys=True)
    return hashlib.sha256((vocab + extra).encode()).hexdigest()


def _load_cached(entry: Path) -> tuple[datasets.Dataset, SplitStats]:
    if not (entry / "stats.json").exists():
        raise PeerFailedError(f"{entry}: tokenized cache missing; the local main process failed to build it")
    stats = SplitStats(**json.loads((entry / "stats.json").read_text()))
    stats.cache_hit = True
    return datasets.load_from_disk(str(entry / "dataset")), stats


def _load_or_tokenize(
    path: Path, entry: Path, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig
) -> tuple[datasets.Dataset, SplitStats]:
    if (entry / "stats.json").exists():
        logger.info("tokenized cache hit: %s (%s)", entry, path)
        return _load_cached(entry)
    logger.info("tokenizing %s (cache %s)", path, entry)
    dataset, stats = tokenize_file(path, tokenizer, cfg)
    tmp = entry.parent / f".tmp-{entry.name}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dataset.save_to_disk(str(tmp / "dataset"))
    (tmp / "stats.json").write_text(json.dumps(asdict(stats), indent=1))
    try:
        os.rename(tmp, entry)  # atomic: the entry is either absent or complete
    except OSError:  # another node finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return _load_cached(entry)[0], stats


def tokenize_file(
    path: Path, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig
) -> tuple[datasets.Dataset, SplitStats]:
    """Every usable row of `path` tokenized and truncated; bad rows raise (or are counted)."""
    stats = SplitStats(path=str(path), format=cfg.data.format)
    use_markers = has_generation_markers(tokenizer)
    if not use_markers:
        logger.info("chat template has no {%% generation %%} markers: assistant masks turn by turn")
    columns: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
    chunks: list[datasets.Dataset] = []
    for index, raw in enumerate(iter_rows(path)):
        stats.rows += 1
        if stats.format == "auto" and not raw.error:
            stats.format = detect_format(raw.data, cfg.data.text_field, raw.location)
            logger.info("data format of %s: %s", path, stats.format)
        tokenized = _tokenize_row(raw, index, tokenizer, use_markers, cfg, stats)
        if tokenized is None:
            continue
        input_ids, labels = tokenized
        columns["input_ids"].append(input_ids)
        columns["labels"].append(labels)
        columns["length"].append(len(input_ids))
        if len(columns["length"]) >= CHUNK_EXAMPLES:
            chunks.append(datasets.Dataset.from_dict(columns, features=FEATURES))
            columns = {name: [] for name in columns}
    chunks.append(datasets.Dataset.from_dict(columns, features=FEATURES))
    if stats.examples == 0:
        first = f"; first: {stats.skipped_examples[0]}" if stats.skipped_examples else ""
        summary = f"{stats.rows} rows, {stats.skipped} skipped{first}"
        raise ConfigError(f"{path}: no usable examples ({summary})", "data.path")
    logger.info(
        "%s: %d examples from %d rows (%d skipped, %d truncated), %d tokens, %d with loss",
        path, stats.examples, stats.rows, stats.skipped, stats.truncated, stats.tokens, stats.loss_tokens,
    )
    return datasets.concatenate_datasets(chunks), stats


def _tokenize_row(
    raw: RawRow,
    index: int,
    tokenizer: PreTrainedTokenizerBase,
    use_markers: bool,
    cfg: TrainConfig,
    stats: SplitStats,
) -> tuple[list[int], list[int]] | None:
    """(input_ids, labels) of one row, truncated; None when the row is skipped (and counted)."""
    try:
        example = parse_row(raw, stats.format, cfg.data.text_field)
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
            input_ids, labels = tokenize_chat(tokenizer, example.messages, use_markers)
    except MaskError as err:
        stats.skip("skipped_mask", index, raw.location, f"assistant mask: {err}")
        return None
    max_length = cfg.train.model_max_length
    if len(input_ids) > max_length:
        stats.truncated += 1
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    n_loss = sum(label != IGNORE_INDEX for label in labels[1:])  # label 0 is never predicted
    if n_loss == 0:
        stats.skip("skipped_no_loss", index, raw.location, "no loss token left after truncation")
        return None
    stats.examples += 1
    stats.tokens += len(input_ids)
    stats.loss_tokens += n_loss
    return input_ids, labels
