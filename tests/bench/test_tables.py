"""BENCHMARKS.md's tables are bench/report/tables.py's output from bench/results, not typed numbers."""

from __future__ import annotations

from bench.report.tables import BENCHMARKS, BLOCK, TABLES, fill


def test_every_marked_table_is_generated_from_the_results():
    text = BENCHMARKS.read_text()
    names = [m.group("name") for m in BLOCK.finditer(text)]
    assert sorted(names) == sorted(TABLES), f"marked blocks {names} vs tables {sorted(TABLES)}"
    assert text == fill(text), "BENCHMARKS.md's tables differ from the results: python -m bench.report.tables --write"
