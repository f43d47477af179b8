"""Eval rows are never training rows, across every source of a mixture: compared by content, not by name.

Two sources can hold the same rows under different names: one file declared twice (once with
`eval_fraction`), an `eval_path` that is another source's training file, hub slices
(`train_sft[:100]` and `train_sft[90:]`) that share a range. So each row is reduced to a short hash of
its content (`row_hash`: the conversation's turns, whitespace-trimmed, with their tool calls, the tool
definitions left out; a text row's text; a pre-tokenized row's ids), and every eval row's hash is looked
up among the training rows' of the whole mixture. The login node does it on the parsed rows
(launcher/resolve/datarules.py), the training side again on the tokenized cache, where each example keeps
its row's hash (train/dataset/load.py); both refuse an overlap in one line naming the two sources and a
row of each, unless `data.allow_eval_overlap = true`.

Which rows `eval_fraction` holds out is `eval_indices` (seeded, on the source's usable rows; a held-out row
that duplicates a kept one goes back to training): one function for the plan's check and the training's
split. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from contract.formats import Example
from contract.schema import ConfigError

HASH_BYTES = 8  # 64 bits: a chance collision among 10M rows is ~3e-6
NO_HASH = bytes(HASH_BYTES)  # a bad row's place (rows keep their ordinal)
ALLOW_KEY = "data.allow_eval_overlap"


def row_hash(example: Example) -> bytes:
    """A hash of what an example trains on (see the module doc)."""
    if example.tokens is not None:
        content: Any = example.tokens[0]
    elif example.text is not None:
        content = example.text.strip()
    else:
        content = [[m["role"], (m.get("content") or "").strip() if isinstance(m.get("content"), str)
                    else m.get("content"), m.get("tool_calls")]
                   for m in example.messages or []]
    text = json.dumps(content, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.blake2b(text.encode(), digest_size=HASH_BYTES).digest()


def eval_indices(size: int, fraction: float, seed: int, hashes: list[bytes] | None = None
                 ) -> tuple[list[int], list[int]]:
    """(train, eval) indices of `size` examples with `fraction` held out for eval, seeded; at least one each
    side (none held out for fraction 0 or fewer than 2 examples). With the examples' `hashes`, a held-out
    row whose content a kept row has too (a duplicate within the source) goes back to training: trained, so
    not evaluated on."""
    if fraction <= 0 or size < 2:
        return list(range(size)), []
    import numpy as np

    order = np.random.default_rng(seed).permutation(size)
    n_eval = min(max(1, round(size * fraction)), size - 1)
    train, held = sorted(order[n_eval:].tolist()), sorted(order[:n_eval].tolist())
    if hashes is not None:  # a held-out duplicate of a kept row is trained, as the data has it twice
        trained = {hashes[i] for i in train}
        duplicates = [i for i in held if hashes[i] in trained]
        train, held = sorted(train + duplicates), [i for i in held if hashes[i] not in trained]
    return train, held


@dataclass(frozen=True)
class Part:
    """One source's rows on one side: their hashes (in row order) and the ordinals (0-based) taken."""

    source: str  # the source's name
    hashes: list[bytes]
    taken: list[int] | None = None  # None: every row with a hash


@dataclass(frozen=True)
class Overlap:
    """Eval rows found among training rows: how many, and the first pair (source, ordinal) of each side."""

    rows: int
    of: int  # eval rows compared
    eval_at: tuple[str, int]
    train_at: tuple[str, int]


def find_overlap(train: list[Part], evals: list[Part]) -> Overlap | None:
    """The eval rows whose content a training row has (None: none)."""
    if not any(part.hashes for part in evals):
        return None  # nothing evaluated: no need to index the training rows
    seen: dict[bytes, tuple[str, int]] = {}
    for part in train:
        for ordinal in _taken(part):
            seen.setdefault(part.hashes[ordinal], (part.source, ordinal))
    hits, compared, first = 0, 0, None
    for part in evals:
        for ordinal in _taken(part):
            compared += 1
            if (where := seen.get(part.hashes[ordinal])) is not None:
                hits += 1
                first = first or ((part.source, ordinal), where)
    return None if first is None else Overlap(hits, compared, *first)


def _taken(part: Part) -> list[int]:
    ordinals = range(len(part.hashes)) if part.taken is None else part.taken
    return [i for i in ordinals if part.hashes[i] != NO_HASH]


def refuse_overlap(overlap: Overlap, eval_row: str, train_row: str) -> ConfigError:
    """The one line an overlap is refused with; `eval_row` / `train_row` name a row of each side."""
    return ConfigError(f"data: {overlap.rows:,} of {overlap.of:,} eval rows are also training rows: eval row "
                       f"{eval_row} of source {overlap.eval_at[0]!r} is training row {train_row} of source "
                       f"{overlap.train_at[0]!r} (evaluating on trained rows measures nothing); hold out other "
                       f"rows, or set {ALLOW_KEY} = true to allow it knowingly", ALLOW_KEY)
