"""The plan's check that no eval row of any source is a training row of any source (contract/overlap.py).

It runs on the login-node check's row hashes (contract/datacheck.py keeps one per row, cached with its
verdict), so it reads nothing again unless it finds an overlap, and then only to name a row of each side.
`eval_fraction` holds out the rows `eval_indices` picks among the source's good rows, as the training does.
"""

from __future__ import annotations

from itertools import islice

from contract.config import TrainConfig
from contract.datacheck import DataCheck, check_rows
from contract.overlap import Overlap, Part, eval_indices, find_overlap, refuse_overlap
from contract.sources import DataSource


def check_eval_overlap(train: TrainConfig, checks: list[DataCheck], hf_home: str) -> Overlap | None:
    """Refuse (ConfigError) eval rows that are training rows, unless data.allow_eval_overlap; the overlap
    found (None: none)."""
    sources = {source.label: source for source in train.data.source_list()}
    trains, evals = [], []
    for check in checks:
        source, hashes = sources[check.name], check.row_hashes()
        if check.eval:
            evals.append(Part(check.name, hashes))
        elif source.eval_fraction:
            good = [i for i, h in enumerate(hashes) if h != bytes(len(h))]
            kept, held = eval_indices(len(good), source.eval_fraction, train.train.seed, [hashes[i] for i in good])
            trains.append(Part(check.name, hashes, [good[i] for i in kept]))
            evals.append(Part(check.name, hashes, [good[i] for i in held]))
        else:
            trains.append(Part(check.name, hashes))
    overlap = find_overlap(trains, evals)
    if overlap is None or train.data.allow_eval_overlap:
        return overlap
    by_side = {(check.name, check.eval): check for check in checks}

    def where(at: tuple[str, int], is_eval: bool) -> str:
        source = sources[at[0]]
        check = by_side.get((at[0], is_eval and not source.eval_fraction))
        return _location(source, check, at[1], hf_home) if check else f"#{at[1] + 1}"

    raise refuse_overlap(overlap, where(overlap.eval_at, True), where(overlap.train_at, False))


def _location(source: DataSource, check: DataCheck, ordinal: int, hf_home: str) -> str:
    """Where the row `ordinal` (0-based, every row counted) of a checked side is: file:line or id[row N]."""
    row = next(islice(check_rows(check, source, hf_home), ordinal, None), None)
    return row.location if row is not None else f"#{ordinal + 1}"


def describe(overlap: Overlap | None) -> str:
    """The plan's line on an overlap allowed knowingly ("" for none)."""
    if overlap is None:
        return ""
    return (f"{overlap.rows:,} of {overlap.of:,} eval rows are also training rows (allowed: "
            f"data.allow_eval_overlap = true); first: source {overlap.eval_at[0]!r} in source {overlap.train_at[0]!r}")
