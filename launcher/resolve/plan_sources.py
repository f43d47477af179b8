"""The plan's per-source table for a mixture (`[[data.sources]]`, several `--data`): what each source
holds, what one epoch of the mixture takes from it, and what the whole run will see of it.

    Sources   rows   tokens  weight  share  epochs  eval  dropped
Rows come from the login-node check (contract/datacheck.py); tokens are counted with the model's own
tokenizer on each source's first rows (launcher/plan/tokencount.py; the verdict cached beside large
data as `.NAME.tokens.json`), else, without a tokenizer.json at hand, estimated from characters
(launcher/plan/datasize.py; a hub dataset: its cached Arrow files' bytes), as the plan then says.
The mixture's arithmetic is contract/sources.py's (the same `epoch_examples` the training side draws with).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol

from contract import protocol
from contract.config import SHIPPED_TOKENIZER, TrainConfig
from contract.datacheck import DataCheck, LocalData, cache_file
from contract.overlap import eval_indices
from contract.readers import hub_cache_folder, iter_hub_rows
from contract.schema import ConfigError
from contract.sources import DataSource, epoch_examples, looks_like_hub_id
from launcher.plan.datasize import DataEstimate, estimate_arrow, estimate_tokens
from launcher.plan.planner import Plan
from launcher.plan.tokencount import SAMPLE_ROWS, CountingTokenizer, TokenCount, count_rows
from launcher.resolve.presets import model_dir
from launcher.resolve.profile import ClusterProfile

COUNT_VERSION = 2  # bump when the count's rules change, so cached counts are not reused
_COUNTED: dict[str, TokenCount | None] = {}  # this process's counts (the micro-batch fit and the plan share them)


class SourcesView(Protocol):
    """What the table reads of a launch (launcher/resolve/options.py's `Launch` is one)."""

    profile: ClusterProfile
    train: TrainConfig
    data_checks: list[DataCheck]


@dataclass
class SourceRow:
    """One source's line of the table (per epoch of the mixture unless said otherwise)."""

    name: str
    rows: int  # rows of its training data (as checked, or estimated)
    usable: int  # rows minus bad rows skipped minus rows held out for eval
    tokens: int | None  # estimated tokens of the usable rows
    weight: str  # "x0.3" or "n=500"
    takes: int  # examples one epoch of the mixture takes
    eval_rows: int  # held out (eval_fraction) or its own eval data
    dropped: int  # bad rows skipped (data.allow_bad_rows)
    method: str = ""  # how its tokens were obtained
    longer: int = 0  # usable rows longer than model_max_length (cut to it)
    longest: int = 0  # tokens of its longest row read
    lengths: str = ""  # how `longer` and `longest` were had (DataEstimate.lengths)

    @property
    def epoch_tokens(self) -> int | None:
        return None if self.tokens is None or not self.usable else round(self.tokens * self.takes / self.usable)


def source_rows(launch: SourcesView) -> list[SourceRow]:
    """A row per source, from preflight's checks when they ran (else from the estimates alone)."""
    data = launch.train.data
    checks = {check.name: check for check in launch.data_checks if not check.eval}
    own_eval = {check.name: check.rows - check.bad_rows for check in launch.data_checks if check.eval}
    rows = []
    for source in data.source_list():
        estimate = estimate_source(launch, source)
        check = checks.get(source.label)
        total = check.rows if check else (estimate.rows if estimate else 0)
        dropped = check.bad_rows if check and data.allow_bad_rows else 0
        held_out = _held_out(check, total - dropped, source.eval_fraction, launch.train.train.seed)
        usable = total - dropped - held_out
        tokens = round(estimate.tokens * usable / estimate.rows) if estimate and estimate.rows else \
            (estimate.tokens if estimate else None)
        weight = f"n={source.samples:,}" if source.samples else f"x{source.weight:g}"
        longer = round(estimate.longer * usable / estimate.rows) if estimate and estimate.rows else 0
        rows.append(SourceRow(source.label, total, usable, tokens, weight, epoch_examples(source, usable),
                              held_out or own_eval.get(source.label, 0), dropped, estimate.method if estimate else "",
                              longer, estimate.longest if estimate else 0, estimate.lengths if estimate else ""))
    return rows


def _held_out(check: DataCheck | None, good: int, fraction: float, seed: int) -> int:
    """Rows eval_fraction holds out: contract/overlap.py's eval_indices on the check's row hashes (a held-out
    duplicate of a kept row is trained), else the fraction's share."""
    if not fraction:
        return 0
    hashes = [h for h in check.row_hashes() if any(h)] if check else []
    if len(hashes) != good:
        return round(good * fraction)
    return len(eval_indices(good, fraction, seed, hashes)[1])


def estimate_source(launch: SourcesView, source: DataSource) -> DataEstimate | None:
    """A source's training tokens: counted with the model's tokenizer on its first rows (mean x rows), else
    estimated from its characters or bytes; None when neither can be had."""
    max_length, hf_home = launch.train.train.model_max_length, launch.profile.hf_home
    path = Path(source.path).expanduser()
    tokenizer = tokenizer_dir(launch.train, hf_home)
    if tokenizer is None or not (path.exists() or looks_like_hub_id(source.path)):
        guess = _estimate(source, hf_home, max_length)
        return guess if guess is None or tokenizer is not None else \
            replace(guess, method=f"{guess.method}; no tokenizer.json to count with")
    counted = _count(source, tokenizer, hf_home)
    # every row counted: no estimate wanted; else it is the fallback, and a sample takes its row count
    all_counted = counted is not None and counted.complete and counted.rows > 0
    guess = None if all_counted else _estimate(source, hf_home, max_length)
    if counted is None or not counted.rows:
        return guess
    rows = counted.rows if counted.complete else (guess.rows if guess and guess.rows else counted.rows)
    how = f"all {counted.rows:,} rows" if counted.complete else f"the first {counted.rows:,} rows"
    scale, exact = rows / counted.rows, counted.complete or bool(guess and guess.exact_rows)
    sample = "" if counted.complete else f" of {'' if exact else '~'}{rows:,} (a sample)"
    return DataEstimate(round(counted.tokens(max_length) * scale), rows,
                        f"{how} counted with {tokenizer.name}'s tokenizer", exact,
                        longer=round(counted.longer(max_length) * scale), longest=counted.longest,
                        lengths=f"counted with {tokenizer.name}'s tokenizer on {how}{sample}")


def tokenizer_dir(train: TrainConfig, hf_home: str) -> Path | None:
    """The folder with the tokenizer.json the training will load: model.tokenizer, else model.path (a local
    folder or an HF id's snapshot in hf_home's cache), else the shipped tiny one; None when not here."""
    value = train.model.tokenizer or train.model.path
    directory = model_dir(value, hf_home) if value else SHIPPED_TOKENIZER
    return directory if directory is not None and (directory / "tokenizer.json").is_file() else None


def counted_rows(launch: SourcesView, source: DataSource) -> TokenCount | None:
    """A source's training rows counted with the model's tokenizer (None: no tokenizer.json here, or unreadable)."""
    path = Path(source.path).expanduser()
    tokenizer = tokenizer_dir(launch.train, launch.profile.hf_home)
    if tokenizer is None or not (path.exists() or looks_like_hub_id(source.path)):
        return None
    return _count(source, tokenizer, launch.profile.hf_home)


def _count(source: DataSource, tokenizer: Path, hf_home: str) -> TokenCount | None:
    """`count_rows` of a source, once per process; cached beside large local data (keyed by its files'
    size and mtime, the tokenizer's files and the mapping; its lengths are uncut, for any max_length)."""
    path = Path(source.path).expanduser()
    local = LocalData(path.resolve(), source.split) if path.exists() else None
    parts = {"version": COUNT_VERSION, "source": asdict(source), "hf_home": hf_home,
             "sample": SAMPLE_ROWS, "files": _stats([*(local.files() if local else []), *tokenizer.iterdir()])}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    if key in _COUNTED:
        return _COUNTED[key]
    cache = cache_file(local, kind="tokens") if local is not None else None
    try:
        stored = json.loads(cache.read_text(encoding="utf-8")) if cache is not None else {}
        if stored.get("key") == key:
            _COUNTED[key] = TokenCount(**stored["count"])
            return _COUNTED[key]
    except (OSError, ValueError, TypeError, KeyError):
        pass  # absent or unreadable: count again
    rows = local.rows() if local is not None else \
        iter_hub_rows(source.path, source.config, source.split, hf_home, "data")
    try:
        counted = count_rows(rows, source.format, source.text_field, source.mapping, CountingTokenizer(tokenizer))
    except (ConfigError, OSError, ValueError):
        counted = None  # unreadable here: preflight names the problem; the plan falls back to the estimate
    _COUNTED[key] = counted
    if cache is not None and counted is not None:
        protocol.write_json_atomically(cache, {"key": key, "count": asdict(counted)})
    return counted


def _stats(files: list[Path]) -> list[tuple[str, int, int]]:
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(files) if p.is_file()]


def _estimate(source: DataSource, hf_home: str, max_length: int) -> DataEstimate | None:
    """The characters / bytes estimate (launcher/plan/datasize.py)."""
    path = Path(source.path).expanduser()
    if path.exists():
        return estimate_tokens(path, max_length, source.split)
    if not looks_like_hub_id(source.path):
        return None
    files = _hub_split_files(hub_cache_folder(source.path, hf_home), source.config, source.split)
    return estimate_arrow(files, max_length, "hub cache") if files else None  # as a saved datasets folder


def _hub_split_files(root: Path, config: str, split: str) -> list[Path]:
    """A cached hub dataset's Arrow files of `split` (NAME-SPLIT.arrow, NAME-SPLIT-00000-of-00002.arrow) in
    its newest prepared folder (<root>/<config>/<version>/<hash>/)."""
    folder = root / config if config else root
    if not folder.is_dir():
        return []
    files = [*folder.rglob(f"*-{split}.arrow"), *folder.rglob(f"*-{split}-*-of-*.arrow")]
    if not files:
        return []
    newest = max({file.parent for file in files}, key=lambda parent: parent.stat().st_mtime)
    return sorted(file for file in files if file.parent == newest)


def mixture_estimate(rows: list[SourceRow]) -> DataEstimate | None:
    """Tokens of one epoch of the mixture (what the planner counts steps from); None if a source is unknown."""
    tokens = [row.epoch_tokens for row in rows]
    if any(t is None for t in tokens):
        return None
    examples = sum(row.takes for row in rows)
    methods = sorted({row.method for row in rows if row.method})
    how = (f"mixture of {len(rows)} source{'' if len(rows) == 1 else 's'}"
           + (f"; {'; '.join(methods)}" if methods else ""))
    longer = round(sum(row.longer * row.takes / row.usable for row in rows if row.usable))
    lengths = "; ".join(sorted({f"{row.name}: {row.lengths}" for row in rows if row.longer and row.lengths}))
    return DataEstimate(sum(t for t in tokens if t), examples, how, False, longer=longer,
                        longest=max((row.longest for row in rows), default=0), lengths=lengths)


def source_table(launch: SourcesView, plan: Plan, rows: list[SourceRow]) -> list[str]:
    """The plan's lines for a mixture (none for one plain source: its `Data` line says it all);
    `rows`: `source_rows(launch)`, estimated once for the plan and this table."""
    if not launch.train.data.sources:
        return []
    epoch_tokens = sum(row.epoch_tokens or 0 for row in rows)
    t = launch.train.train
    passes = t.num_train_epochs
    if t.max_steps > 0:
        passes = plan.time.total_tokens / epoch_tokens if plan.time.total_tokens and epoch_tokens else None
    width = max(len("source"), *(len(row.name) for row in rows))
    lines = [f"Sources {'source':<{width}} {'rows':>9} {'tokens':>9} {'weight':>8} {'share':>6} {'epochs':>7} "
             f"{'eval':>6} {'dropped':>7}"]
    for row in rows:
        share = f"{row.epoch_tokens / epoch_tokens:.1%}" if row.epoch_tokens is not None and epoch_tokens else "?"
        seen = f"{passes * row.takes / row.usable:.2f}" if passes is not None and row.usable else "?"
        tokens = "?" if row.tokens is None else f"~{_short(row.tokens)}"
        lines.append(f"        {row.name:<{width}} {row.rows:>9,} {tokens:>9} {row.weight:>8} {share:>6} "
                     f"{seen:>7} {row.eval_rows:>6,} {row.dropped:>7,}")
    return lines


def _short(n: int) -> str:
    for scale, unit, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}{unit}"
    return str(n)
