"""Cells and files shared by BENCHMARKS.md's table modules (bench/report/tables.py, bench/report/tables_parity.py,
bench/report/tables_save.py)."""

from __future__ import annotations

import json
import statistics

from bench.report.results_io import RESULTS, clock_start


def load_result(name: str) -> dict:
    """A results file by its path under bench/results."""
    return json.loads((RESULTS / name).read_text())


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def percent(value: float | None, digits: int = 1) -> str:
    return f"{value * 100:.{digits}f}%" if value is not None else "n/a"


def per_gpu_rate(side: dict) -> float:
    """Real tokens per second per GPU of one side or run."""
    return side["real_tokens_per_s"] / side["gpu_count"]


def save_cell(save: dict) -> str:
    """A checkpoint save of a results file: its size and seconds."""
    return f"{save['gb']:.1f} GB in {save['seconds']:.1f} s"


def timed_windows(windows: list[dict]) -> list[dict]:
    """The logged windows on the run's clock: those after the first record past the warm-up."""
    start = clock_start(w["step"] for w in windows)
    return [w for w in windows if w["step"] > start]


def median_and_slow_steps(run: dict, digits: int) -> tuple[float, str]:
    """A run's median timed step (s) and its steps over 1.5 x that median ("step: seconds", or "none")."""
    steps = [(w["step"], w["seconds"]) for w in timed_windows(run["windows"])]
    median = statistics.median(seconds for _, seconds in steps)
    return median, ", ".join(f"{step}: {seconds:.{digits}f} s" for step, seconds in steps if seconds > 1.5 * median) or "none"
