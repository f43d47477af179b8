"""Tokenizer loading and the tokenized train/eval datasets (train.dataset.load in docs/ARCHITECTURE.md).

`build_datasets` reads every source (`data.source_list()`: a file, a folder of shards, a saved
`datasets` folder or a hub dataset from the HF cache, contract/readers.py), normalises every row with
the source's format and mapping (contract.formats), tokenizes it on the node's cores
(train/dataset/tokenize.py) with loss only on assistant tokens (train.dataset.chat), truncates to `train.model_max_length`, and caches each source's result with
`datasets.save_to_disk` under `data.cache_dir` (default RUN_DIR/cache). The cache key hashes the
data files' path/size/mtime, the tokenizer (vocabulary, merges, specials, chat template), the max
length, the format and mapping, so a requeued job loads the cache instead of re-tokenizing. A cache
entry appears atomically (written to a temp dir, then renamed), so a job killed while tokenizing
never leaves a half-written cache behind. The sources' examples are concatenated in order; which of
them an epoch takes is the bundle's `Mixture` (contract/sources.py).

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
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import datasets
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from contract.config import SHIPPED_TOKENIZER, TrainConfig
from contract.failure import PeerFailedError
from contract.datacheck import LocalData
from contract.readers import DEFAULT_SPLIT, RawRow, hub_cache_folder, iter_hub_rows
from contract.overlap import HASH_BYTES, Part, eval_indices, find_overlap, refuse_overlap
from contract.schema import ConfigError
from contract.sources import DataSource, Mixture, epoch_examples, looks_like_hub_id
from train.dataset.tokenize import MAX_LISTED_SKIPS, SplitStats, combined, tokenize_input

logger = logging.getLogger(__name__)

CACHE_VERSION = 5  # bump when tokenization/masking changes so old caches are not reused


@dataclass
class DataBundle:
    train: datasets.Dataset  # every source's examples, in source order; columns input_ids, labels (-100), length
    eval: datasets.Dataset | None  # every source's eval examples
    stats: dict[str, Any]  # train split's SplitStats fields, plus "eval": {...} and eval_examples; summed
    # over the sources with several, each source's own under "sources"
    mixture: Mixture | None = None  # which examples each epoch takes (contract/sources.py)
    eval_parts: dict[str, datasets.Dataset] = field(default_factory=dict)  # by source name, with several sources

    @property
    def eval_sets(self) -> dict[str, datasets.Dataset]:
        """The eval sets to report, by source name ("" = one source's, reported as `eval_loss` alone)."""
        if self.eval_parts:
            return self.eval_parts
        return {"": self.eval} if self.eval is not None and len(self.eval) else {}


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


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id padded batches and generate() pad with: the pad token, else end-of-sequence (load_tokenizer
    sets one; a tokenizer from elsewhere, e.g. an export's, may lack it)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _local_path(cfg: TrainConfig, value: str) -> Path | None:
    """A data path as given (absolute or relative to the working dir), else relative to run.dir; None: neither."""
    for candidate in (Path(value), cfg.run.resolve(value)):
        if candidate.exists():
            return candidate.resolve()
    return None


@dataclass(frozen=True)
class SourceInput:
    """Rows to tokenize: a source's train (or eval) data, a local path or a hub id read from the HF cache."""

    source: DataSource
    path: Path | None  # None: the hub dataset `source.path`, split `split`
    split: str
    key: str  # the config key that named it, for errors
    beside: bool = False  # a file's eval_split: in the files beside it (contract/readers.py)

    @property
    def where(self) -> str:
        """What the log and stats.json name: the files read (a file's eval_split: the ones beside it)."""
        if self.path is None:
            return f"{self.source.path}[{self.split}]"
        return ", ".join(str(file) for file in self.local.files()) if self.beside else str(self.path)

    @property
    def local(self) -> LocalData:
        assert self.path is not None
        return LocalData(self.path, self.split, self.key, self.beside)

    def rows(self) -> Iterator[RawRow]:
        if self.path is not None:
            return self.local.rows()
        return iter_hub_rows(self.source.path, self.source.config, self.split, "", self.key)

    def files(self) -> list[Path]:
        """What the tokenized cache is keyed on: the split's files (a hub id: its prepared cache)."""
        if self.path is None:
            root = hub_cache_folder(self.source.path, "")
            return sorted(p for p in root.rglob("*") if p.is_file())
        return self.local.files()


def source_inputs(cfg: TrainConfig, index: int, source: DataSource) -> tuple[SourceInput, SourceInput | None]:
    """A source's train input and its eval input (eval_path / eval_split), if it has its own."""
    key = cfg.data.key(index, "path")
    train = _source_input(cfg, source, source.path, source.split, key)
    if source.eval_path:
        return train, _source_input(cfg, source, source.eval_path, DEFAULT_SPLIT, cfg.data.key(index, "eval_path"))
    if source.eval_split:
        return train, SourceInput(source, train.path, source.eval_split, cfg.data.key(index, "eval_split"), beside=True)
    return train, None


def _source_input(cfg: TrainConfig, source: DataSource, value: str, split: str, key: str) -> SourceInput:
    path = _local_path(cfg, value)
    if path is None and not looks_like_hub_id(value):
        raise ConfigError(f"{key}: {value!r} does not exist (relative paths: working dir or run.dir)", key)
    return SourceInput(replace(source, path=value), path, split, key)


def build_datasets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    is_main: bool = True,
    barrier: Callable[[], Any] | None = None,
) -> DataBundle:
    """Tokenized train (and eval) datasets of every source, from the cache when it is there. See the module doc."""
    sources = cfg.data.source_list()
    inputs = {}
    for index, source in enumerate(sources):
        inputs[(index, "train")], eval_input = source_inputs(cfg, index, source)
        if eval_input is not None:
            inputs[(index, "eval")] = eval_input
    cache_root = cfg.run.resolve(cfg.data.cache_dir or "cache")
    entries = {name: cache_root / f"tokenized-{cache_key(item, tokenizer, cfg)}" for name, item in inputs.items()}
    if is_main:
        try:
            loaded = {name: _load_or_tokenize(inputs[name], entries[name], tokenizer, cfg) for name in inputs}
        finally:  # release the waiting processes even on failure, so they fail fast instead of hanging
            if barrier is not None:
                barrier()
    else:
        if barrier is not None:
            barrier()
        loaded = {name: _load_cached(entries[name]) for name in inputs}
    return _bundle(cfg, sources, loaded)


def _bundle(cfg: TrainConfig, sources: list[DataSource],
            loaded: dict[tuple[int, str], tuple[datasets.Dataset, SplitStats]]) -> DataBundle:
    """Each source's train and eval sets (own eval data, else a seeded fraction), joined into one bundle."""
    trains, evals, per_source = [], {}, []
    for index, source in enumerate(sources):
        train, train_stats = loaded[(index, "train")]
        eval_set, eval_stats = loaded.get((index, "eval"), (None, None))
        if eval_set is None:
            train, eval_set = split_eval(train, source.eval_fraction, cfg.train.seed)
        trains.append(train)
        if eval_set is not None and len(eval_set):
            evals[source.label] = eval_set
        stats = {**asdict(train_stats), "eval": asdict(eval_stats) if eval_stats else None}
        per_source.append(stats | {"name": source.label, "eval_examples": len(eval_set) if eval_set else 0,
                                   "train_examples": len(train)})
    check_no_eval_overlap(cfg, {s.label: t for s, t in zip(sources, trains)}, evals)
    mixture = Mixture(tuple(len(t) for t in trains),
                      tuple(epoch_examples(s, len(t)) for s, t in zip(sources, trains)))
    train = trains[0] if len(trains) == 1 else datasets.concatenate_datasets(trains)
    eval_set = None if not evals else datasets.concatenate_datasets(list(evals.values())) if len(evals) > 1 \
        else next(iter(evals.values()))
    stats = per_source[0] if len(sources) == 1 else _summed(per_source)
    for entry, take in zip(per_source, mixture.takes):
        entry["epoch_examples"] = take
    return DataBundle(train=train, eval=eval_set, stats=stats, mixture=mixture,
                      eval_parts=evals if len(sources) > 1 else {})


def _summed(per_source: list[dict[str, Any]]) -> dict[str, Any]:
    """The mixture's stats: every count summed over the sources, each source's own under "sources"."""
    counts = [f.name for f in fields(SplitStats) if f.type == "int"] + ["eval_examples", "train_examples"]
    total: dict[str, Any] = {name: combined(name, [s[name] for s in per_source]) for name in counts}
    total["skipped_examples"] = [line for s in per_source for line in s["skipped_examples"]][:MAX_LISTED_SKIPS]
    return total | {"path": ", ".join(s["path"] for s in per_source), "format": "mixture", "sources": per_source}


def split_eval(
    dataset: datasets.Dataset, fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """A deterministic (by seed) eval split of `fraction` of the examples; at least one each side."""
    if fraction <= 0 or len(dataset) < 2:
        return dataset, None
    # the plan's check holds out the same rows; a duplicate of a kept row is not evaluated on
    hashes = _row_hashes(dataset) if "row_hash" in dataset.column_names else None
    train_idx, eval_idx = eval_indices(len(dataset), fraction, seed, hashes)
    return dataset.select(train_idx), dataset.select(eval_idx)


def check_no_eval_overlap(cfg: TrainConfig, trains: dict[str, datasets.Dataset],
                          evals: dict[str, datasets.Dataset]) -> None:
    """No eval example's content is a training example's, across all sources (contract/overlap.py's row hash,
    kept with each tokenized example): the login node checked the rows, this checks what the cache holds."""
    if not evals or cfg.data.allow_eval_overlap:
        return
    train_parts = [Part(name, _row_hashes(data)) for name, data in trains.items()]
    eval_parts = [Part(name, _row_hashes(data)) for name, data in evals.items()]
    overlap = find_overlap(train_parts, eval_parts)
    if overlap is not None:
        raise refuse_overlap(overlap, f"#{overlap.eval_at[1] + 1} (of its examples)", f"#{overlap.train_at[1] + 1}")


def _row_hashes(dataset: datasets.Dataset) -> list[bytes]:
    """Each example's row_hash column (its row's content hash, as the plan's check has it)."""
    return [value.to_bytes(HASH_BYTES, "little", signed=True) for value in dataset["row_hash"]]


def cache_key(item: SourceInput, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig) -> str:
    """Hash of everything that changes the tokenized result (not the file contents: stats suffice)."""
    source = item.source
    parts = {
        "version": CACHE_VERSION,
        "files": [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in item.files()],
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_length": cfg.train.model_max_length,
        "format": source.format,
        "text_field": source.text_field,
        "allow_bad_rows": cfg.data.allow_bad_rows,
        "mapping": asdict(source.mapping),
        "input": [source.path if item.path is None else "", source.config, item.split],
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
    item: SourceInput, entry: Path, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig
) -> tuple[datasets.Dataset, SplitStats]:
    if (entry / "stats.json").exists():
        logger.info("tokenized cache hit: %s (%s)", entry, item.where)
        return _load_cached(entry)
    logger.info("tokenizing %s (cache %s)", item.where, entry)
    tmp = entry.parent / f".tmp-{entry.name}-{socket.gethostname()}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    spill = tmp / "tokenized.arrow"  # written block by block: a large source never sits in memory
    dataset, stats = tokenize_input(item.rows(), item.source, item.where, item.key, tokenizer, cfg, spill=spill)
    dataset.save_to_disk(str(tmp / "dataset"))
    del dataset
    spill.unlink()
    (tmp / "stats.json").write_text(json.dumps(asdict(stats), indent=1))
    try:
        os.rename(tmp, entry)  # atomic: the entry is either absent or complete
    except OSError:  # another node finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return _load_cached(entry)[0], stats
