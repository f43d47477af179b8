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


# BENCHMARKS.md's dated sessions: a measured-looking number there is traced when it is, at its printed precision, a
# value of a results file the same section names (by path, or its folder), a per-GPU rate, a percentage of a
# fraction, a ratio of two of its runs' rates (not its windows'), or a ratio of two of one file's times (its "ms"
# and "…_ms" fields). A number no file gives (a call that kept no file, a figure from a log) stays only with NO_FILE
# right after it, so the reader sees it too; their count may only shrink. A target ("≥ 1.25×") is not a measurement.
NO_FILE = " (no results file)"
NO_FILE_AT_MOST = 0
TARGET = "≥ "
FILE_NAMED = re.compile(r"(?:h[12]00|cpu)/[\w.-]+/[\w.+-]+\.json|(?:h[12]00|cpu)/[\w.-]+/")


def _values(node: object, rates: list[float], out: set[float], times: list[float], window: bool = False) -> None:
    """Collect `node`'s numbers into `out`, its runs' per-GPU rates into `rates` and its times into `times`. A
    window's rate is a value of its own but never a side of a ratio: the pairs of a run's many windows would
    match almost any ratio by chance."""
    if isinstance(node, dict):
        for key, value in node.items():
            _values(value, rates, out, times, window or key == "windows")
        for key in ("real_tokens_per_s", "tokens_per_s"):
            if isinstance(node.get(key), (int, float)):
                (out.add if window else rates.append)(node[key] / (node.get("gpu_count") or 1))
        times += [value for key, value in node.items()
                  if (key == "ms" or key.endswith("_ms")) and isinstance(value, (int, float))]
    elif isinstance(node, list):
        for value in node:
            _values(value, rates, out, times, window)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        out.update((float(node), float(node) * 100))


def _section_values(section: str) -> set[float]:
    import json

    from bench.report.results_io import RESULTS

    named = set(FILE_NAMED.findall(section))
    files = [path for path in RESULTS.rglob("*.json")
             if any(str(path.relative_to(RESULTS)).startswith(name) for name in named)]
    values: set[float] = set()
    rates: list[float] = []
    for path in files:
        times: list[float] = []
        _values(json.loads(path.read_text()), rates, values, times)
        values.update(a / b for a in times for b in times if b)
    values.update(rates)
    values.update(a / b for a in rates for b in rates if b)
    return values


def _traced(literal: str, values: set[float]) -> bool:
    number = re.match(r"[\d,]+(?:\.\d+)?", literal).group(0).replace(",", "")
    digits = len(number.split(".")[1]) if "." in number else 0
    return any(round(value, digits) == float(number) for value in values)


def _dated_numbers(text: str) -> list[tuple[str, str, str | set[float]]]:
    """(section heading, number, "target", "no file" or its section's file values) for each measured-looking number
    of BENCHMARKS.md outside generated blocks and figures."""
    text = FIG.sub("<!-- fig -->", BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text))
    found = []
    for section in re.split(r"\n(?=## )", text):
        heading = section.split("\n", 1)[0][:80]
        matches = list(MEASURED.finditer(section))
        values = _section_values(section) if matches else set()
        for m in matches:
            kind = ("no file" if section.startswith(NO_FILE, m.end()) else
                    "target" if section[:m.start()].endswith(TARGET) else values)
            found.append((heading, m.group(0), kind))
    return found


def benchmarks_untraced(text: str) -> list[str]:
    """BENCHMARKS.md's measured-looking numbers that their sections' files do not give and that are neither a target
    nor tagged NO_FILE, as "section heading: number" (repeats counted)."""
    return [f"{heading}: {literal}" for heading, literal, kind in _dated_numbers(text)
            if isinstance(kind, set) and not _traced(literal, kind)]


def benchmarks_without_file(text: str) -> list[str]:
    """BENCHMARKS.md's numbers tagged NO_FILE, as "section heading: number"."""
    return [f"{heading}: {literal}" for heading, literal, kind in _dated_numbers(text) if kind == "no file"]


def test_benchmarks_prose_numbers_are_traced_to_their_sections_files_or_say_they_have_none():
    from bench.report.tables import BENCHMARKS

    text = BENCHMARKS.read_text()
    untraced, without_file = benchmarks_untraced(text), benchmarks_without_file(text)
    assert not untraced, (f"typed numbers no results file of their section gives: name the file (a backticked "
                          f"path) in the section, reword, or tag the number{NO_FILE!r}: {untraced}")
    assert len(without_file) <= NO_FILE_AT_MOST, (
        f"{len(without_file)} numbers tagged{NO_FILE!r}, at most {NO_FILE_AT_MOST} before: {without_file}")


HEADING = "## 4 GPUs, a session (issue #1, 2026-11-27, 4 × H100)"
DATED = HEADING + "\n\nThe run (`h100/four-gpu-2026-11-27/`) gave {number}.\n"


def test_an_untraced_number_fails_unless_tagged_right_after_it():
    assert benchmarks_untraced(DATED.format(number="9,999 real tokens/s")) == [f"{HEADING}: 9,999 real tokens/s"]
    tagged = DATED.format(number=f"9,999 real tokens/s{NO_FILE}")
    assert benchmarks_untraced(tagged) == []
    assert benchmarks_without_file(tagged) == [f"{HEADING}: 9,999 real tokens/s"]
    assert benchmarks_untraced(DATED.format(number=f"9,999 real tokens/s per GPU{NO_FILE}")) != []
    assert benchmarks_untraced(DATED.format(number="2.71× (target ≥ 1.25×)")) == [f"{HEADING}: 2.71×"]


def test_a_number_is_traced_only_to_a_file_its_section_names():
    traced = DATED.format(number="8,438 real tokens/s per GPU (39.5% MFU, 1.21× the peer)")
    assert benchmarks_untraced(traced) == []
    assert benchmarks_untraced(traced.replace("`h100/four-gpu-2026-11-27/`", "the call")) == [
        f"{HEADING}: 8,438 real tokens/s", f"{HEADING}: 39.5% MFU", f"{HEADING}: 1.21×"]
