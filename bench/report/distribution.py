"""A comparison is a distribution, not a pair (issue #51): each side runs N >= 3 times in one call, the sides
alternating (peer, ours, peer, ours, ...), and every run is recorded. The figure is the median ratio with its range:

    ratio_median = median(ours' rates) / median(the peer's rates)
    ratio_min    = slowest run of ours / fastest run of the peer
    ratio_max    = fastest run of ours / slowest run of the peer

A peer run more than PEER_LOW below the peer's own median is suspect (at 8B on 4 GPUs the same TRL peer ran at
6,996 to 5,101 tokens/s/GPU): the driver runs it once more and keeps both, the slow one marked `rerun_as` (left
out of the figure); a slow run left in is explained from its step times (`peer_low_runs`: its slow steps).
tests/bench/test_results.py re-derives every field here from the runs.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

RUNS_PER_SIDE = 3
PEER_LOW = 0.15  # a peer run this far below the peer's median is re-run or explained
SLOW_STEP = 1.5  # a step this many times the run's median step time is a slow one


def alternating(runs_per_side: int) -> list[str]:
    """The order of one call's runs: the peer first (its cold start is not ours to pay), then turn about."""
    return [side for _ in range(runs_per_side) for side in ("peer", "ours")]


def counted(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs a figure uses: finished ones, less those replaced by a re-run."""
    return [r for r in runs if "error" not in r and "rerun_as" not in r]


def low_runs(runs: list[dict[str, Any]]) -> list[int]:
    """Indices (into `runs`) of the counted runs more than PEER_LOW below the counted runs' median rate."""
    rates = [r["real_tokens_per_s"] for r in counted(runs)]
    if not rates:
        return []
    median = statistics.median(rates)
    return [i for i, r in enumerate(runs) if r in counted(runs) and r["real_tokens_per_s"] < (1 - PEER_LOW) * median]


def slow_steps(step_seconds: list[float]) -> dict[str, Any]:
    """Where a slow run lost its time: the timed steps over SLOW_STEP x its median step, and their share."""
    if not step_seconds:
        return {"slow_steps": [], "slow_share": 0.0}
    median = statistics.median(step_seconds)
    slow = [i for i, s in enumerate(step_seconds) if s > SLOW_STEP * median]
    return {"median_step_s": median, "slow_steps": slow,
            "slow_share": sum(step_seconds[i] for i in slow) / sum(step_seconds)}


def summary(ours: list[dict[str, Any]], peer: list[dict[str, Any]]) -> dict[str, Any]:
    """The figure of one comparison from every run of both sides (see the module's docstring)."""
    mine = [r["real_tokens_per_s"] for r in counted(ours)]
    theirs = [r["real_tokens_per_s"] for r in counted(peer)]
    if not mine or not theirs:
        return {"runs_per_side": min(len(mine), len(theirs)), "ratio_median": None, "ratio_min": None,
                "ratio_max": None, "peer_low_runs": []}
    explained = [{"run": i, "below_median": 1 - peer[i]["real_tokens_per_s"] / statistics.median(theirs),
                  **slow_steps(peer[i].get("step_seconds", []))} for i in low_runs(peer)]
    return {"runs_per_side": min(len(mine), len(theirs)),
            "ratio_median": statistics.median(mine) / statistics.median(theirs),
            "ratio_min": min(mine) / max(theirs), "ratio_max": max(mine) / min(theirs),
            "peer_low_runs": explained}


def run_alternating(runs_per_side: int, run_peer: Callable[[int], dict[str, Any]],
                    run_ours: Callable[[int], dict[str, Any]],
                    landed: Callable[[list[str], list[dict], list[dict]], None] = lambda *_: None,
                    ) -> tuple[list[str], list[dict], list[dict]]:
    """Run both sides `runs_per_side` times, alternating; then each peer run more than PEER_LOW below the peer's
    median once more (the slow one kept, marked `rerun_as`). Returns (order as run, peer runs, our runs);
    the callables take the run's index within its side; `landed` sees (order, peer, ours) after every run."""
    order, peer, ours = [], [], []
    for side in alternating(runs_per_side):
        runs, run = (peer, run_peer) if side == "peer" else (ours, run_ours)
        runs.append(run(len(runs)))
        order.append(side)
        landed(order, peer, ours)
    for index in low_runs(peer):
        peer[index]["rerun_as"] = len(peer)
        peer.append(run_peer(len(peer)))
        order.append("peer")
        landed(order, peer, ours)
    return order, peer, ours


def comparison(order: list[str], peer: list[dict], ours: list[dict], ours_side: dict[str, Any],
               peer_side: dict[str, Any]) -> dict[str, Any]:
    """A results file's comparison fields: the order, each side's settings (`path`, `gradient_checkpointing`, ...)
    with every run, and the figure (summary)."""
    return {"order": list(order), "sides": {"ours": {**ours_side, "runs": list(ours)},
                                            "peer": {**peer_side, "runs": list(peer)}},
            **summary(ours, peer)}


def compare(runs_per_side: int, run_peer: Callable[[int], dict[str, Any]], run_ours: Callable[[int], dict[str, Any]],
            ours_side: dict[str, Any], peer_side: dict[str, Any],
            written: Callable[[dict[str, Any]], None] = lambda _: None) -> dict[str, Any]:
    """run_alternating, then comparison's fields; `written` gets them after every run as well, so that a call cut
    short by its time limit keeps the runs it finished (a bench rewrites its results file there)."""
    landed = lambda order, peer, ours: written(comparison(order, peer, ours, ours_side, peer_side))  # noqa: E731
    return comparison(*run_alternating(runs_per_side, run_peer, run_ours, landed), ours_side, peer_side)


def repeat_of(parser: argparse.ArgumentParser, repeat: int | None, both_sides: bool, cpu: bool) -> int:
    """A multi-GPU bench's --repeat: as given, else RUNS_PER_SIDE when both sides run on GPUs and 1 otherwise (one
    side has nothing to alternate with; on CPU the TRL peer cannot build its model, so no run of it lands).
    --repeat N > 1 of one side is a usage error (exit 2)."""
    if repeat is None:
        return RUNS_PER_SIDE if both_sides and not cpu else 1
    if repeat < 1 or (repeat > 1 and not both_sides):
        parser.error(f"--repeat {repeat}: N >= 1 runs a side, N > 1 only with both sides (ours and the peer)")
    return repeat


def ratio_cell(record: dict[str, Any]) -> str:
    """A comparison's ratio as BENCHMARKS.md's tables say it: the median of N with its range, or a single pair."""
    if record.get("runs_per_side", 1) > 1:
        return (f"{record['ratio_median']:.2f}× (median of {record['runs_per_side']}, "
                f"{record['ratio_min']:.2f}–{record['ratio_max']:.2f}×)")
    return f"{record.get('ratio_vs_peer', record.get('ratio_median')):.2f}× (1 run a side)"  # older files: ratio_vs_peer
