"""Measured numbers in the prose of README.md and docs/, generated from bench/results like the tables (issue #61).

A figure inside a sentence reads `<!-- fig NAME -->text<!-- /fig -->` (one line); `python -m bench.report.tables
--write` rewrites the text from FIGURES[NAME], tests/bench/test_tables.py fails when a page's text differs, and
tests/bench/test_prose_numbers.py fails on a measured-looking number (tokens/s, % MFU, a ratio ×, GiB at peak) in
README.md or docs/ outside a generated block or figure. A table in prose (the speed model's calibration excerpt) is
a `<!-- table NAME -->` block like BENCHMARKS.md's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from bench.report.results_io import ROOT, WARMUP_STEPS
from bench.report.table_cells import load_result, markdown_table, percent
from bench.report.tables_headline import JOBS, Job, rows_of

FIG = re.compile(r"<!-- fig (?P<name>[\w-]+) -->(?P<body>[^\n]*?)<!-- /fig -->")
LONGCTX = "h200/longctx-2026-11-29/longctx-llama3-8b-lora-262144-offload-mlp-chunks.json"
QLORA_70B = "h100/two-gpu-2026-11-26/qlora-llama70b-2gpu.json"
CALIBRATION = ROOT / "tests" / "fixtures" / "speed_calibration.json"


def _job(name: str) -> Job:
    return next(job for job in JOBS if job.job == name)


def longctx_262k() -> str:
    r = load_result(LONGCTX)
    return (f"{r['peak_mem_gib']:.1f} GiB allocated at peak, {r['tokens_per_s']:,.0f} real tokens/s and "
            f"{percent(r['mfu'])} MFU in step {r['step']}, the last of {r['step']} (one step's rate: `{LONGCTX}`)")


def _calls(name: str) -> str:
    """A job's same-call ratios as a range over its calls (never their median), with its calls and builds."""
    rows = [row for row in rows_of(_job(name)) if row.ratio_value is not None]
    ratios = [row.ratio_value for row in rows]
    span = f"{ratios[0]:.2f}×" if len(ratios) == 1 else f"{min(ratios):.2f}–{max(ratios):.2f}×"
    if len(rows) == 1:
        return f"{span} our bf16 (one call, one run a side)"
    return f"{span} our bf16 ({len(rows)} calls at {len({row.build for row in rows})} builds, one run a side each)"


def fp8_own() -> str:
    return _calls("8B FP8 full fine-tune (our float8 linears)")


def fp8_torchao() -> str:
    return _calls("8B FP8 full fine-tune (torchao's linears)")


COMPARE_1B = "h200/compare-2026-11-29/compare-llama3.2-1b-ours-vs-peer-trl.json"


def compare_1b_steps() -> str:
    """The timed steps and warm-up of every run of the 1B comparison (one number when all agree)."""
    r = load_result(COMPARE_1B)
    runs = [run for side in r["sides"].values() for run in side["runs"]]
    steps = sorted({run["steps"] for run in runs})
    warmup = sorted({run.get("warmup_steps", WARMUP_STEPS) for run in runs})
    return f"{'–'.join(map(str, steps))} steps after {'–'.join(map(str, warmup))} of warm-up"


def qlora_70b_peak() -> str:
    return f"{load_result(QLORA_70B)['peak_mem_gib']:.1f} GiB"


FIGURES: dict[str, Callable[[], str]] = {"longctx-262k": longctx_262k, "fp8-own": fp8_own, "fp8-torchao": fp8_torchao,
                                         "qlora-70b-peak": qlora_70b_peak, "compare-1b-steps": compare_1b_steps}

# docs/speed.md's excerpt of the speed model's calibration (tests/fixtures/speed_calibration.json, which
# tests/launcher/test_speed_calibration.py re-derives from the results files): these runs, in this order.
EXCERPT = ("h100/four-gpu-2026-11-26/lora-bf16-llama70b-4gpu.json", QLORA_70B,
           "h100/four-gpu-2026-11-28b/multi-4gpu-8b-full-log10-t10240-clip-in-step-2.json 8b_full",
           "h200/two-gpu-2026-11-28b/multi-2gpu-fp8-own-6.json fp8_8b.fp8", "h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json 8b_lora",
           LONGCTX, "h100/single-2026-11-26/single-llama3.2-1b-ours.json")


def speed_calibration_excerpt() -> str:
    rows = {row["file"]: row for row in json.loads(CALIBRATION.read_text())["rows"]}
    cells = []
    for name in EXCERPT:
        row = rows[name]
        off = " (known off)" if row["known_off"] else ""
        cells.append([f"`{name.split()[0]}`", row["setting"], f"{row['measured_tokens_per_s_per_gpu']:,.0f}",
                      f"{row['predicted_tokens_per_s_per_gpu']:,.0f}", f"{row['speed_error'] * 100:+.1f}%{off}"])
    return markdown_table(["results file (bench/results/…)", "setting", "measured", "predicted", "error"], cells)


PROSE_TABLES = {"speed-calibration-excerpt": speed_calibration_excerpt}


def fill_figures(text: str) -> str:
    """`text` with every figure span's text replaced by its generated value."""
    return FIG.sub(lambda m: f"<!-- fig {m.group('name')} -->{FIGURES[m.group('name')]()}<!-- /fig -->", text)
