"""bench/multi/gpu_multi.py --only 8b-peer end to end on CPU (BENCH_CPU_SMOKE: tiny shape, 2 gloo ranks started
as 2 machines): our side trains to its last step, saves once after the warm-up, exports nothing
(run.export_dir = ""), leaves no checkpoint behind, and the results file re-derives
(tests/bench/test_results_kinds.py's check). The TRL peer builds its model on CUDA (bench/peers/peer_trl.py): here its launch runs and fails, and
the failure is recorded beside our side instead of ending the call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites.gpu_single import TINY
from bench.common.synthetic import sample_lengths
from tests.bench.test_results_kinds import check_8b_full

REPO = Path(__file__).resolve().parents[2]


def _without_allocator_setting() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}


@pytest.mark.slow
def test_cpu_smoke_measures_ours_with_one_save_and_records_the_peer(tmp_path: Path) -> None:
    out, results = tmp_path / "out", tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench.multi.gpu_multi", "--gpus", "2", "--only", "8b-peer", "--out", str(out),
                           "--results", str(results), "--steps8b-full", "9", "--tokens8b-full", "1024"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**_without_allocator_setting(), "BENCH_CPU_SMOKE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| 8B full checkpoint save at step 6 |" in proc.stdout
    assert [p.name for p in results.iterdir()] == ["multi-2gpu-8b-full.json"]  # no file of the other phases
    record = json.loads((results / "multi-2gpu-8b-full.json").read_text())
    ours = record["8b_full"]
    assert ours["steps"] == record["steps"] == 5 and ours["save"]["step"] == 6, ours
    assert [w["step"] for w in ours["windows"]] == list(range(1, 10))
    assert all(w["gc_s"] >= 0 for w in ours["windows"])
    assert (ours["precision"], ours["alloc_conf"]) == ("auto", "expandable_segments:True"), ours  # train's own
    assert ours["kernels"]["attention"] and ours["kernels"]["fused_mlp"] is False, ours["kernels"]  # CPU: no quack
    check_8b_full(record, TINY, sample_lengths(record["docs"], seed=0, hi=record["max_doc_tokens"]), "smoke")
    run = out / "run-8b-full"
    assert not (run / "checkpoints").exists() and not list(run.glob("model*.safetensors"))
    assert (run / "machine0.log").exists() and (run / "machine1.log").exists()
    assert "8b_full_peer" in record or record["8b_full_peer_error"].startswith("exit ")
    assert "provenance" in record


def test_an_allocator_ab_runs_one_side_per_file_and_records_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The A/B of #29 (our allocator setting against torch's default) runs ours alone under each setting and
    the peer once: --sides8b-full picks the sides, --tag names each call's file, and every side records the
    allocator setting it ran with (train's default where the environment has none)."""
    from bench.multi import gpu_multi, multi_full
    from train.main import CUDA_ALLOC_CONF

    args = gpu_multi.parse_args(["--gpus", "4", "--only", "8b-peer", "--sides8b-full", "ours", "--no-save8b-full",
                                 "--tag", "torch-alloc"])
    assert (args.sides8b_full, args.no_save8b_full) == ({"ours"}, True)
    assert multi_full.result_name(args) == "multi-4gpu-8b-full-torch-alloc.json"
    with pytest.raises(SystemExit):  # argparse's usage error, exit 2
        gpu_multi.parse_args(["--only", "8b-peer", "--sides8b-full", "ours,trl"])
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert multi_full.allocator_setting(CUDA_ALLOC_CONF) == "expandable_segments:True"
    assert multi_full.allocator_setting("") == ""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert multi_full.allocator_setting(CUDA_ALLOC_CONF) == "expandable_segments:False"


def test_a_run_of_ours_cut_short_keeps_the_windows_it_logged(tmp_path: Path) -> None:
    """A run killed by its limit after its save (the 8B FP8 run of 2026-11-27) had logged 30 steps; the record
    keeps them beside the error instead of only "timeout 215 s"."""
    from bench.multi import multi_full

    run = tmp_path / "run"
    run.mkdir()
    assert multi_full.failed(run, "timeout 215 s") == {"error": "timeout 215 s", "windows": []}  # killed before step 1
    lines = [{"step": step, "tokens_per_s": 100.0, "elapsed_s": 2.0 * step, "mfu": 0.5, "gc_s": 0.0} for step in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    cut = multi_full.failed(run, "timeout 215 s")
    assert [(w["step"], w["seconds"]) for w in cut["windows"]] == [(1, 2.0), (2, 2.0), (3, 2.0)]


@pytest.mark.slow
def test_checkpointing_runs_ours_with_activation_checkpointing_and_records_it(tmp_path: Path) -> None:
    """--checkpointing8b-full (8B on two 80 GB GPUs) renders ours with gradient checkpointing on and the record says so."""
    out, results = tmp_path / "out", tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench.multi.gpu_multi", "--gpus", "2", "--only", "8b-peer", "--out", str(out),
                           "--results", str(results), "--steps8b-full", "6", "--tokens8b-full", "1024", "--sides8b-full",
                           "ours", "--no-save8b-full", "--checkpointing8b-full"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**_without_allocator_setting(), "BENCH_CPU_SMOKE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((results / "multi-2gpu-8b-full.json").read_text())
    assert record["8b_full"]["gradient_checkpointing"] is True and "8b_full_peer" not in record, record.keys()
    assert "gradient_checkpointing = true" in (out / "run-8b-full" / "train.toml").read_text()


def test_the_fp8_phase_takes_bf16_from_an_earlier_file_and_overrides_the_fp8_run_alone(tmp_path: Path) -> None:
    """An FP8 variant (fp32 accumulation) is compared with the bf16 run of an earlier 8b-fp8 or 8b-peer file of the
    same call; --fp8-set reaches only the FP8 run."""
    from bench.multi import gpu_multi, multi_fp8

    fp8_file, peer_file, neither = tmp_path / "fp8.json", tmp_path / "peer.json", tmp_path / "none.json"
    fp8_file.write_text(json.dumps({"fp8_8b": {"bf16": {"real_tokens_per_s": 1.0}, "fp8": {}}}))
    peer_file.write_text(json.dumps({"8b_full": {"real_tokens_per_s": 2.0}}))
    neither.write_text(json.dumps({"8b_full_error": "timeout"}))
    assert [multi_fp8.bf16_baseline(f) for f in (fp8_file, peer_file, neither)] == [
        {"real_tokens_per_s": 1.0}, {"real_tokens_per_s": 2.0}, None]
    args = gpu_multi.parse_args(["--only", "8b-fp8", "--fp8-set", "train.fp8_fast_accum=false", "--fp8-set", "train.seed=1"])
    assert args.fp8_set == ["train.fp8_fast_accum=false", "train.seed=1"]
