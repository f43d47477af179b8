"""BENCHMARKS.md's tables are bench/report/tables.py's output from bench/results, not typed numbers."""

from __future__ import annotations

from bench.report.tables import BENCHMARKS, BLOCK, TABLES, fill


def test_every_marked_table_is_generated_from_the_results():
    text = BENCHMARKS.read_text()
    names = [m.group("name") for m in BLOCK.finditer(text)]
    assert sorted(names) == sorted(TABLES), f"marked blocks {names} vs tables {sorted(TABLES)}"
    assert text == fill(text), "BENCHMARKS.md's tables differ from the results: python -m bench.report.tables --write"


def test_the_headline_table_opens_the_page():
    """Issue #56: a reader's first screen is the headline table, before any history."""
    first_screen = "\n".join(BENCHMARKS.read_text().splitlines()[:30])
    assert "<!-- table headline -->" in first_screen and first_screen.count("<!-- /table -->") == 1


def test_a_headline_ratio_is_one_run_a_side_until_three_calls_give_a_median_and_range():
    from bench.report.tables_headline import Job, _ratio_cell

    job = Job("8B", 2, "H200", "none", "ours", "peer", "TRL")
    assert _ratio_cell(job, [("a.json", 1.5)]) == "1.50× TRL (1 run a side)"
    assert _ratio_cell(job, [("a", 1.0), ("b", 3.0), ("c", 1.25)]) == "1.25× TRL: median of 3 calls, 1.00–3.00×"
    assert _ratio_cell(job, []) == "TRL: no run in the same call"
