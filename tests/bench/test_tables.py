"""BENCHMARKS.md's tables are bench/report/tables.py's output from bench/results, not typed numbers."""

from __future__ import annotations

from bench.report.tables import BENCHMARKS, BLOCK, PAGES, TABLES, fill


def test_every_marked_table_is_generated_from_the_results():
    names = []
    for page in PAGES:
        text = page.read_text()
        names += [m.group("name") for m in BLOCK.finditer(text)]
        assert text == fill(text), f"{page.name}'s generated blocks differ from the results: python -m bench.report.tables --write"
    assert sorted(names) == sorted(TABLES), f"marked blocks {names} vs tables {sorted(TABLES)}"


def test_the_headline_table_opens_the_page():
    """Issue #56: a reader's first screen is the headline table, before any history."""
    lines = BENCHMARKS.read_text().splitlines()
    assert "<!-- table headline -->" in lines[:12], "the headline table starts the page"
    assert "<!-- /table -->" not in lines[:lines.index("<!-- table headline -->")], "no other table before it"


def _job(name: str, gpus: int, kind: str):
    from bench.report.tables_headline import JOBS

    return next(job for job in JOBS if (job.job, job.gpus, job.kind) == (name, gpus, kind))


def test_every_headline_row_takes_its_number_mfu_and_ratio_from_one_run_and_its_own_call():
    """Issue #61: no row pairs figures of different runs; a ratio across calls or builds is never a median."""
    from bench.report.table_cells import per_gpu_rate
    from bench.report.tables_headline import JOBS, NO_PEER, rows_of

    for job in JOBS:
        for row in rows_of(job):
            if row.run is None:
                continue
            assert "× " + row.job.peer_name + ": median of" not in row.ratio or "runs a side in one call" in row.ratio, row.ratio
            if row.ratio_value is not None:  # the ratio's own call holds the row's run
                assert row.ratio.startswith(f"{row.ratio_value:.2f}×"), row.ratio
            else:
                assert row.ratio.startswith(NO_PEER), row.ratio
            assert per_gpu_rate(row.run) > 0 and row.file


def test_the_8b_four_h100_row_shows_each_call_with_its_build_and_flags_the_slow_peer():
    from bench.report.tables_headline import rows_of

    rows = [row for row in rows_of(_job("8B full fine-tune", 4, "H100")) if row.ratio_value is not None]
    assert [f"{row.ratio_value:.2f}" for row in rows] == ["0.86", "1.21", "2.01"]
    assert len({row.build for row in rows}) == 3
    assert [("15% rule" in row.ratio) for row in rows] == [False, False, True]


def test_a_copied_bf16_side_is_no_peer_of_the_same_call():
    """multi_fp8.py --fp8-baseline takes the bf16 side from another invocation: not a same-call ratio (item 4)."""
    from bench.report.tables_headline import rows_of

    rows = rows_of(_job("8B FP8 full fine-tune (torchao's linears)", 4, "H100"))
    assert [row.file for row in rows if row.ratio_value is not None] == ["h100/four-gpu-2026-11-27d/multi-4gpu-fp8.json"]


def test_a_call_of_three_runs_a_side_replaces_the_single_run_calls(tmp_path, monkeypatch):
    """When a --repeat call lands (here the 1B comparison's file standing in for a 4-GPU one), the job's row is that
    call's distribution alone; before it, each single-run call is a row of its own."""
    import shutil

    from bench.report import tables_headline
    from bench.report.results_io import RESULTS

    job = tables_headline.Job("8B full fine-tune", 4, "H100", "h100/four-gpu-*/multi-4gpu-8b-full*.json", "8b_full",
                              "8b_full_peer", "TRL + FSDP2")
    for name in ("h100/four-gpu-2026-11-26/multi-4gpu-8b-full.json", "h100/four-gpu-2026-11-27d/multi-4gpu-8b-full.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS / name, tmp_path / name)
    monkeypatch.setattr(tables_headline, "RESULTS", tmp_path)
    assert [row.ratio_value is not None for row in tables_headline.rows_of(job)] == [True, True]
    repeat = tmp_path / "h100/four-gpu-2026-12-06/multi-4gpu-8b-full.json"
    repeat.parent.mkdir(parents=True)
    shutil.copy(RESULTS / "h200/compare-2026-11-29/compare-llama3.2-1b-ours-vs-peer-trl.json", repeat)
    (row,) = tables_headline.rows_of(job)
    assert row.file == "h100/four-gpu-2026-12-06/multi-4gpu-8b-full.json" and "median of 3 runs a side in one call" in row.ratio
