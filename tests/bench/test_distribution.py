"""A comparison is a distribution (issue #51, bench/report/distribution.py): each side runs N times alternating,
a slow peer run is run again, and the figure is the median ratio with its range, re-derived from the runs by
tests/bench/results_checks.check_compare_record (check_distribution for the multi-GPU files). Built from committed
one-run files at other rates, the multi-GPU benches' runs replaced by stand-ins; no GPU, no processes."""

from __future__ import annotations

import copy

import pytest

from bench.common.synthetic import SHAPES, document_lengths, sample_lengths
from bench.report import distribution
from bench.report.results_io import RESULTS, throughput_numbers
from tests.bench import results_checks as checks
from tests.bench.results_checks import check_compare_record, load
from tests.bench.test_results import SINGLE_PAIR


def _runs_like(run: dict, rates: list[float]) -> list[dict]:
    """Copies of a committed run at other rates (same tokens, other seconds)."""
    return [{**run, "seconds": run["real_tokens"] / rate, "real_tokens_per_s": rate} for rate in rates]


def test_a_comparison_is_the_median_of_alternating_runs_and_a_slow_peer_run_is_run_again():
    ours_file, peer_file = (load(RESULTS / name) for name in SINGLE_PAIR)
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


def _peer_like(block: dict, arch: dict, lengths: list[int], rate: float) -> dict:
    """A committed multi-GPU peer run at another rate, with its per-step times (equal steps)."""
    seconds = block["real_tokens"] / rate
    return {**block, "seconds": seconds, "real_tokens_per_s": rate, "step_seconds": [seconds / block["steps"]] * block["steps"],
            **throughput_numbers(arch, lengths, rate, block["gpu_count"], block["peak_flops"])}


def test_the_8b_full_comparison_alternates_records_every_run_and_rederives(tmp_path, monkeypatch):
    """bench/multi/multi_full.py --repeat 3 (gpu_multi's 8b-peer) with stand-in runs of both sides, from the committed
    8B file: peer first, turn about, the slow third peer run again; the file re-derives as a committed one would."""
    from bench.multi import gpu_multi, host, multi_full
    from tests.bench.test_results import FULL
    from tests.bench.test_results_kinds import check_multi

    monkeypatch.setattr(host, "CPU_SMOKE", False)
    committed = load(RESULTS / FULL)
    args = gpu_multi.parse_args(["--gpus", "4", "--only", "8b-peer", "--results", str(tmp_path), "--out", str(tmp_path),
                                 "--tokens8b-full", str(committed["tokens_per_gpu"])])
    assert args.repeat == distribution.RUNS_PER_SIDE
    lengths = sample_lengths(committed["docs"], seed=0, hi=committed["max_doc_tokens"])
    rate = committed["8b_full_peer"]["real_tokens_per_s"]
    rates = iter([rate, 1.01 * rate, 0.8 * rate, 0.99 * rate])
    calls = []
    monkeypatch.setattr(multi_full, "ours", lambda a, data, arch, index: calls.append(("ours", index)) or copy.deepcopy(committed["8b_full"]))
    monkeypatch.setattr(multi_full, "peer", lambda a, data, arch, index: calls.append(("peer", index)) or _peer_like(
        committed["8b_full_peer"], SHAPES["llama3-8b"], lengths, next(rates)))
    rows: list = []
    multi_full.bench_8b_peer(args, tmp_path / "docs.jsonl", 2.0, rows)
    assert calls == [("peer", 0), ("ours", 0), ("peer", 1), ("ours", 1), ("peer", 2), ("ours", 2), ("peer", 3)]
    record = load(tmp_path / "multi-4gpu-8b-full.json")
    assert "8b_full" not in record and record["sides"]["peer"]["runs"][2]["rerun_as"] == 3
    check_multi(record, "in memory", tmp_path / "multi-4gpu-8b-full.json")
    assert not checks.multi_problems(record, "in memory")
    ours_rate = committed["8b_full"]["real_tokens_per_s"]
    assert record["ratio_median"] == pytest.approx(ours_rate / rate) and record["runs_per_side"] == 3
    assert rows[-1] == ("8B full FT ours / TRL+FSDP2 real tokens/s", distribution.ratio_cell(record))
    tampered = copy.deepcopy(record)
    tampered["sides"]["ours"]["runs"][1]["windows"][-1]["seconds"] += 0.5
    assert any(p.startswith("windows:") for p in checks.multi_problems(tampered, "tampered"))
    tampered = copy.deepcopy(record)
    tampered["ratio_max"] *= 1.01
    with pytest.raises(AssertionError, match="ratio_max"):
        check_multi(tampered, "tampered", tmp_path / "multi-4gpu-8b-full.json")
    with pytest.raises(SystemExit):  # one side has nothing to alternate with (argparse's usage error, exit 2)
        gpu_multi.parse_args(["--only", "8b-peer", "--sides8b-full", "ours", "--repeat", "3"])


def test_the_8b_lora_comparison_alternates_and_records_ours_windows(tmp_path, monkeypatch):
    """bench/multi/gpu_multi_lora.py --repeat 3 with stand-in runs (the committed 2-GPU LoRA file's sides): every run
    lands in `sides`, ours with its logged windows, the peer with its step times, and the file re-derives."""
    from bench.multi import gpu_multi_lora, host
    from tests.bench.test_results_kinds import check_multi

    monkeypatch.setattr(host, "CPU_SMOKE", False)
    committed = load(RESULTS / "h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json")
    raw = ("path", "real_tokens", "seconds", "warmup_steps", "real_tokens_per_s", "peak_mem_gib", "steps")
    peer = {k: committed["8b_lora_peer"][k] for k in raw}
    ours = {k: committed["8b_lora"][k] for k in raw}
    monkeypatch.setattr(gpu_multi_lora, "ours", lambda a, data, arch, index: dict(ours))
    monkeypatch.setattr(gpu_multi_lora, "peer", lambda a, data, index: {
        **peer, "step_seconds": [peer["seconds"] / peer["steps"]] * peer["steps"], "gradient_checkpointing": False})
    monkeypatch.setattr(gpu_multi_lora, "windows", lambda metrics: [])
    monkeypatch.setattr("sys.argv", ["gpu_multi_lora", "--gpus", "2", "--docs", str(committed["docs"]), "--budget",
                                     str(committed["budget"]), "--out", str(tmp_path), "--results", str(tmp_path)])
    gpu_multi_lora.main()
    record = load(tmp_path / "multi-2gpu-8b-lora.json")
    assert record["order"] == distribution.alternating(3) and all("windows" in r for r in record["sides"]["ours"]["runs"])
    check_multi(record, "in memory", tmp_path / "multi-2gpu-8b-lora.json")
    assert not checks.multi_problems(record, "in memory")
    assert record["ratio_median"] == pytest.approx(committed["ratio_vs_peer"])
