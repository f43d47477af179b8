"""Issue #61: a measured number in README.md or docs/ comes from a generated block or figure (bench/report/tables.py,
bench/report/figures.py), never typed: outside those, no tokens/s, % MFU, speed ratio (×) or GiB-at-peak figure."""

from __future__ import annotations

import re

import pytest

from bench.report.figures import FIG, FIGURES
from bench.report.results_io import ROOT
from bench.report.tables import BLOCK, PAGES

PROSE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MEASURED = re.compile(r"\d[\d,]*(?:\.\d+)? (?:real )?tokens/s|\d+(?:\.\d+)?% MFU|\d+\.\d+×"
                      r"|\d+(?:\.\d+)? GiB (?:reserved|allocated|at peak)")


def typed_figures(text: str) -> list[str]:
    """The measured-looking numbers of `text` outside its generated blocks and figures, with their line."""
    text = FIG.sub("<!-- fig -->", BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text))
    return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in MEASURED.finditer(text)]


@pytest.mark.parametrize("page", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_measured_numbers_in_prose_are_generated(page):
    typed = typed_figures(page.read_text())
    assert not typed, (f"{page.relative_to(ROOT)}: typed measured numbers (make each a <!-- fig NAME --> of "
                       f"bench/report/figures.py, or point to BENCHMARKS.md): {typed}")


def test_a_typed_number_is_found_and_a_generated_one_is_not():
    assert typed_figures("ran at 1,517 real tokens/s, 36.3% MFU; 1.27× bf16") == [
        "line 1: 1,517 real tokens/s", "line 1: 36.3% MFU", "line 1: 1.27×"]
    assert not typed_figures("at <!-- fig fp8-own -->1.24–1.29× our bf16<!-- /fig -->\n<!-- table headline -->\n"
                             "| 1,515 tokens/s |\n<!-- /table -->\n")


def test_every_figure_is_used_and_every_used_figure_exists():
    used = {m.group("name") for page in PAGES for m in FIG.finditer(page.read_text())}
    assert used == set(FIGURES), f"figures used {sorted(used)}, defined {sorted(FIGURES)}"
    assert all(page in PAGES for page in PROSE if FIG.search(page.read_text())), "a page with figures not in PAGES"
