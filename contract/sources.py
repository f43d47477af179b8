"""Data sources and their mixture: `[[data.sources]]` in train.toml, `--data PATH[:WEIGHT]` on the CLI.

A source is a file (JSONL/JSON/Parquet/CSV), a folder of such shards, a saved `datasets` folder, or a
hub dataset id read from the HF cache with the hub offline, plus its format, column and role mapping,
a weight (or a fixed number of samples), and its own eval split. Torch-free: the launcher validates
and plans with it, train builds the mixture with it.

The mixture of one epoch: source i contributes `epoch_examples(i)` examples: `samples` if set, else
round(weight x its examples): weight 1 = every example once (a single source is exactly today's
epoch), 0.3 = a seeded 30% drawn anew each epoch, 2.5 = two passes plus a seeded half. The chosen
examples of all sources are packed together (documents of different sources share micro-batches),
so the epoch's plan is a function of (lengths, budget, seed, epoch, weights), and a resume needs only
(epoch, micro-batch index), as for one file.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Literal

from contract.formats import COLUMNS, MAPPED_ROLES, RowMapping
from contract.readers import DATA_SUFFIXES, DEFAULT_SPLIT
from contract.schema import ConfigError, require

DataFormat = Literal["auto", "sharegpt", "messages", "alpaca", "prompt_completion", "text", "tokens"]
# A hub repo id: `name` or `org/name`, each part a letter or digit then letters, digits, `_`, `.`, `-`
# (so never `./x`, `/x`, `~/x` or `a/b/c`, which can only be paths).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
DATA_FILE_SUFFIXES = (*DATA_SUFFIXES, ".txt")  # names of files, never of a hub dataset
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
_SHARD_NAME = re.compile(r"^.*-\d+-of-\d+")
_GENERIC = frozenset({"data", "dataset", "datasets", "shards", "parquet", "jsonl", "json", "csv", ".", "..", ""})


@dataclass
class DataSource:
    """One `[[data.sources]]` table."""

    path: str  # file, folder of shards, saved `datasets` folder, or hub dataset id (from the HF cache)
    name: str = ""  # unique; names its eval loss (eval_loss/<name>) and its plan row; "" = from the path
    format: DataFormat = "auto"
    text_field: str = "text"  # format "text": the column holding the text
    config: str = ""  # hub id: the dataset's config name ("" = its only/default one)
    split: str = DEFAULT_SPLIT  # the split to train on: a hub id's, a saved DatasetDict's, or the files whose
    # names say it (contract/readers.py: train-00000-of-00001.parquet, train.jsonl, train/); "train" of data
    # whose names say no split = all of it
    columns: dict[str, str] = field(default_factory=dict)  # the format's column -> the data's, e.g. prompt = "question"
    roles: dict[str, str] = field(default_factory=dict)  # the data's role -> system/user/assistant/tool
    system_prompt: str = ""  # the first turn of every conversation that has no system turn
    tools: str = ""  # a JSON file: tool definitions for rows without a `tools` column (the template's `tools`)
    weight: float = 1.0  # examples per epoch = weight x the source's examples (1 = each once)
    samples: int = 0  # > 0: exactly this many examples per epoch (instead of weight)
    eval_fraction: float = 0.0  # split off this share of the source for eval
    eval_path: str = ""  # or: the source's own eval data (same format and mapping)
    eval_split: str = ""  # or this split of it (a file's: in the files beside it that name it)

    def validate(self) -> None:
        require(bool(self.path), "path", "give a file, folder or hub dataset id")
        require(self.weight > 0, "weight", f"must be > 0, got {self.weight:g} (leave a source out instead of 0)")
        require(self.samples >= 0, "samples", "must be >= 0 (0 = use weight)")
        require(0.0 <= self.eval_fraction < 1.0, "eval_fraction", "must be in [0, 1)")
        require(sum(map(bool, (self.eval_fraction, self.eval_path, self.eval_split))) <= 1, "eval_fraction",
                "give one of eval_fraction, eval_path, eval_split")
        require(self.eval_split != self.split, "eval_split",
                f"{self.eval_split!r} is also the training split: evaluating on training rows measures nothing")
        require(not self.eval_path or Path(self.eval_path).expanduser().resolve() != Path(self.path).expanduser().resolve(),
                "eval_path", "is the training data itself: evaluating on training rows measures nothing "
                "(give other data, eval_split or eval_fraction)")
        require(not self.name or bool(_NAME.match(self.name)), "name",
                f"{self.name!r}: letters, digits, '.', '_', '-' only (it names metrics keys)")
        known = set(COLUMNS.get(self.format, ())) if self.format != "auto" else \
            {c for names in COLUMNS.values() for c in names}
        unknown = sorted(set(self.columns) - known)
        require(not unknown, "columns", f"unknown column name(s) {unknown} for format {self.format!r}; "
                f"valid: {', '.join(sorted(known))}")
        bad_roles = sorted(r for r in self.roles.values() if r not in MAPPED_ROLES)
        require(not bad_roles, "roles", f"roles map onto {', '.join(MAPPED_ROLES)}; got {bad_roles}")
        self._tool_definitions()  # a tools file that cannot be read is a config error, named here

    @cached_property
    def mapping(self) -> RowMapping:
        return RowMapping(dict(self.columns), dict(self.roles), self.system_prompt, self._tool_definitions())

    def _tool_definitions(self) -> list:
        """The `tools` file's definitions (a JSON list), read once."""
        if not self.tools:
            return []
        try:
            tools = json.loads(Path(self.tools).expanduser().read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"tools: {self.tools}: {getattr(err, 'strerror', None) or err}", "tools") from None
        if not isinstance(tools, list):
            raise ConfigError(f"tools: {self.tools}: expected a JSON list of tool definitions", "tools")
        return tools

    @property
    def label(self) -> str:
        """The source's name: `name`, else the file's stem / the hub id's last part."""
        return self.name or default_name(self.path)

    @property
    def has_eval(self) -> bool:
        """The source holds out eval examples: a fraction of itself, or eval data of its own."""
        return bool(self.eval_fraction or self.eval_path or self.eval_split)


def default_name(path: str) -> str:
    """A source's name from its path: the file's or folder's name, or, where that name says nothing of the
    data (`data`, `shards`, a shard's as `train-00000-of-00003`), its folder's."""
    parts = Path(path.rstrip("/")).parts
    stems = [_stem(part) for part in parts]
    index = len(stems) - 1
    while index > 0 and (stems[index] in _GENERIC or _SHARD_NAME.match(stems[index])):
        index -= 1
    return re.sub(r"[^\w.-]+", "_", stems[index] if stems else "") or "data"


def _stem(name: str) -> str:
    for suffix in DATA_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def looks_like_hub_id(value: str) -> bool:
    """`org/name` or `name` (_HUB_ID) that is no local path and no data file's name (`x.jsonl`, `x.txt`):
    a hub dataset, read from the HF cache, never from the network. The one rule of the launcher
    (`--data`, preflight, plan) and train (data.path, data.sources)."""
    return (bool(_HUB_ID.match(value)) and not value.lower().endswith(DATA_FILE_SUFFIXES)
            and not Path(value).expanduser().exists())


def check_unique_names(sources: list[DataSource], key: str = "data.sources") -> None:
    seen: dict[str, int] = {}
    for index, source in enumerate(sources):
        if source.label in seen:
            raise ConfigError(f"{key}[{index}].name: {source.label!r} is also the name of {key}[{seen[source.label]}]"
                              " (names must be unique: set name = \"...\" on one of them)", f"{key}[{index}].name")
        seen[source.label] = index


_SPLIT_OPTION = re.compile(r"^(?P<rest>.+?):split=(?P<split>.+)$")


def split_option(value: str) -> tuple[str, str | None]:
    """`--data PATH[:WEIGHT]:split=NAME` -> (PATH[:WEIGHT], NAME); (value, None) without one (or for a path
    that exists as given)."""
    match = _SPLIT_OPTION.match(value)
    if match is None or Path(value).expanduser().exists():
        return value, None
    return match["rest"], match["split"]


def parse_data_flag(value: str) -> tuple[str, float | None]:
    """`--data PATH[:WEIGHT]` -> (path, weight or None); a path that exists as given keeps its colon."""
    path, sep, tail = value.rpartition(":")
    if not sep or not path or Path(value).expanduser().exists():
        return value, None
    try:
        weight = float(tail)
    except ValueError:
        return value, None
    if weight <= 0:
        raise ConfigError(f"--data {value}: weight must be > 0, got {tail} (leave the source out instead)", "--data")
    return path, weight


def epoch_examples(source: DataSource, examples: int) -> int:
    """How many examples of `source` (which has `examples`) one epoch of the mixture takes."""
    if examples == 0:
        return 0
    return source.samples if source.samples else max(1, round(source.weight * examples))


@dataclass(frozen=True)
class Mixture:
    """Which examples (indices into all sources' examples concatenated) each epoch trains on."""

    sizes: tuple[int, ...]  # examples of each source, in order
    takes: tuple[int, ...]  # examples per epoch of each source (`epoch_examples`)

    @property
    def is_plain(self) -> bool:
        """Every example once per epoch, in order: one file's behaviour."""
        return self.sizes == self.takes

    def select(self, seed: int, epoch: int) -> list[int]:
        """Whole passes over each source, then a seeded sample of the rest (anew each epoch)."""
        chosen: list[int] = []
        offset = 0
        for index, (size, take) in enumerate(zip(self.sizes, self.takes)):
            passes, rest = divmod(take, size) if size else (0, 0)
            chosen += list(range(offset, offset + size)) * passes
            if rest:
                rng = random.Random((seed * 1_000_003 + epoch) * 1_000_003 + index)  # integers only: same everywhere
                chosen += sorted(offset + i for i in rng.sample(range(size), rest))
            offset += size
        return chosen
