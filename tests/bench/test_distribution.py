"""A comparison is a distribution (issue #51, bench/report/distribution.py): each side runs N times alternating,
a slow peer run is run again, and the figure is the median ratio with its range, re-derived from the runs by
tests/bench/results_checks.check_compare_record. Built from committed one-run files at other rates; no GPU."""

from __future__ import annotations

import copy

import pytest

from bench.common.synthetic import SHAPES
from bench.report import distribution
from bench.report.results_io import RESULTS, document_lengths, throughput_numbers
from tests.bench import results_checks as checks
from tests.bench.results_checks import check_compare_record
from tests.bench.test_results import SINGLE_PAIR, _load


def _runs_like(run: dict, rates: list[float]) -> list[dict]:
    """Copies of a committed run at other rates (same tokens, other seconds)."""
    return [{**run, "seconds": run["real_tokens"] / rate, "real_tokens_per_s": rate} for rate in rates]


def test_a_comparison_is_the_median_of_alternating_runs_and_a_slow_peer_run_is_run_again():
    ours_file, peer_file = (_load(RESULTS / name) for name in SINGLE_PAIR)
    ours_rates, peer_rates = iter([64e3, 65e3, 63e3]), iter([50e3, 51e3, 40e3, 50.5e3])  # the third peer run: -20%
    keys = ("path", "real_tokens", "seconds", "real_tokens_per_s", "steps", "warmup_steps")
    pick = lambda r: {k: r[k] for k in keys}  # noqa: E731
    order, peer, ours = distribution.run_alternating(
        3, lambda i: _runs_like(pick(peer_file), [next(peer_rates)])[0], lambda i: _runs_like(pick(ours_file), [next(ours_rates)])[0])
    assert order == ["peer", "ours"] * 3 + ["peer"] and peer[2]["rerun_as"] == 3 and len(peer) == 4
    lengths = document_lengths(ours_file["docs"], ours_file["budget"])
    for run in ours + peer:
        run.update(throughput_numbers(SHAPES[ours_file["shape"]], lengths, run["real_tokens_per_s"], 1,
                                      ours_file["peak_flops"]))
    record = {"shape": ours_file["shape"], "budget": ours_file["budget"], "docs": ours_file["docs"],
              "peak_flops": ours_file["peak_flops"], "order": order,
              "sides": {"ours": {"path": "ours", "gradient_checkpointing": False, "runs": ours},
                        "peer": {"path": "peer-trl", "gradient_checkpointing": False, "runs": peer}},
              **distribution.summary(ours, peer)}
    check_compare_record(record, "in memory")
    assert not checks.compare_problems(record, "in memory")
    assert record["ratio_median"] == pytest.approx(64e3 / 50.5e3) and record["peer_low_runs"] == []
    assert (record["ratio_min"], record["ratio_max"]) == (pytest.approx(63e3 / 51e3), pytest.approx(65e3 / 50e3))
    assert distribution.ratio_cell(record) == "1.27× (median of 3, 1.24–1.30×)"
    tampered = copy.deepcopy(record)
    tampered["ratio_median"] = 64e3 / 40e3  # the slow peer run's figure
    with pytest.raises(AssertionError, match="ratio_median"):
        check_compare_record(tampered, "tampered")
    tampered = copy.deepcopy(record)
    del tampered["sides"]["peer"]["runs"][2]["rerun_as"]  # the slow run kept in the figure, unexplained
    with pytest.raises(AssertionError):
        check_compare_record(tampered, "tampered")
    tampered = copy.deepcopy(record)
    tampered["sides"]["peer"]["runs"][1]["steps"] -= 1
    assert any(p.startswith("comparison:") for p in checks.compare_problems(tampered, "tampered"))
