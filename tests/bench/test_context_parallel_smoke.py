"""bench/multi/gpu_context_parallel.py --cpu-smoke end to end: a tiny shape on 2 gloo ranks started as 2 machines
through the real launcher render (--context_parallel 2), two lengths, one document a step; each results file
passes tests/bench/test_results.py's checks of a CP file (results_checks.longctx_full_problems)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import results_checks as checks


@pytest.mark.slow
def test_cpu_smoke_trains_whole_documents_split_over_two_ranks(tmp_path: Path) -> None:
    results, stdout = checks.run_cpu_smoke("bench.multi.gpu_context_parallel", tmp_path)
    out = tmp_path / "out"  # where run_cpu_smoke ran it
    names = sorted(p.name for p in results.iterdir())
    assert names == ["longctx-tiny-full-256-cp2.json", "longctx-tiny-full-512-cp2.json"]
    for path in results.iterdir():
        r = checks.load(path)
        problems = checks.longctx_full_problems(r, path.name)
        assert not problems, problems
        assert (r["context_parallel"], r["steps"], r["real_tokens"]) == (2, 3, 3 * r["seq_len"]), r
        assert r["peer_unavailable"] and "provenance" in r
        assert "context = 2" in (out / f"run-{r['seq_len']}" / "train.toml").read_text()
    log = (out / "run-512" / "machine0.log").read_text()
    assert "context parallel: 1 groups of 2 ranks" in log
    assert stdout.rstrip().splitlines()[-1].startswith("peer not run:")  # the table is printed last
