"""The plan's per-source table for a mixture (`[[data.sources]]`, several `--data`): what each source
holds, what one epoch of the mixture takes from it, and what the whole run will see of it.

    Sources   rows   tokens  weight  share  epochs  eval  dropped
Rows come from the login-node check (contract/datacheck.py), tokens from launcher/plan/datasize.py's
estimate (a hub dataset: its cached Arrow files' bytes), the mixture's arithmetic from
contract/sources.py (the same `epoch_examples` the training side draws with).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from contract.config import TrainConfig
from contract.datacheck import DataCheck
from contract.readers import hub_cache_folder
from contract.sources import DataSource, epoch_examples, looks_like_hub_id
from launcher.plan.datasize import DataEstimate, estimate_bytes, estimate_tokens
from launcher.plan.planner import Plan
from launcher.resolve.profile import ClusterProfile


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

    @property
    def epoch_tokens(self) -> int | None:
        return None if self.tokens is None or not self.usable else round(self.tokens * self.takes / self.usable)


def source_rows(launch: SourcesView) -> list[SourceRow]:
    """A row per source, from preflight's checks when they ran (else from the estimates alone)."""
    data, max_length = launch.train.data, launch.train.train.model_max_length
    checks = {check.name: check for check in launch.data_checks if not check.eval}
    own_eval = {check.name: check.rows - check.bad_rows for check in launch.data_checks if check.eval}
    rows = []
    for source in data.source_list():
        estimate = _estimate(source, launch.profile.hf_home, max_length)
        check = checks.get(source.label)
        total = check.rows if check else (estimate.rows if estimate else 0)
        dropped = check.bad_rows if check and data.allow_bad_rows else 0
        held_out = round((total - dropped) * source.eval_fraction) if source.eval_fraction else 0
        usable = total - dropped - held_out
        tokens = round(estimate.tokens * usable / estimate.rows) if estimate and estimate.rows else \
            (estimate.tokens if estimate else None)
        weight = f"n={source.samples:,}" if source.samples else f"x{source.weight:g}"
        rows.append(SourceRow(source.label, total, usable, tokens, weight, epoch_examples(source, usable),
                              held_out or own_eval.get(source.label, 0), dropped))
    return rows


def _estimate(source: DataSource, hf_home: str, max_length: int) -> DataEstimate | None:
    path = Path(source.path).expanduser()
    if path.exists():
        return estimate_tokens(path, max_length)
    if not looks_like_hub_id(source.path):
        return None
    root = hub_cache_folder(source.path, hf_home)
    arrow = sum(p.stat().st_size for p in root.rglob(f"*-{source.split}*.arrow")) if root.is_dir() else 0
    return estimate_bytes(arrow, 0, "Arrow")  # as a saved datasets folder is estimated


def mixture_estimate(rows: list[SourceRow]) -> DataEstimate | None:
    """Tokens of one epoch of the mixture (what the planner counts steps from); None if a source is unknown."""
    tokens = [row.epoch_tokens for row in rows]
    if any(t is None for t in tokens):
        return None
    examples = sum(row.takes for row in rows)
    return DataEstimate(sum(t for t in tokens if t), examples, f"mixture of {len(rows)} source{'' if len(rows) == 1 else 's'}", False)


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
