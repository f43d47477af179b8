"""Every strategy the CLI offers (fsdp, fsdp1, zero2, zero3) x LoRA x CPU offload trains, checkpoints,
resumes bitwise and exports a loadable model (issue #17). One implementation: bench/suites/gpu_strategies.py
(which also prints the table for BENCHMARKS.md); this test runs its cases one by one.
Skipped without CUDA: CI has no GPU. DeepSpeed cases are skipped when deepspeed is not installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from bench.suites.gpu_strategies import all_cases, parse_args, run_case, write_profile

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_strategy_trains_resumes_and_exports(case, tmp_path):
    if case.strategy.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed not installed (pip install deepspeed; its ops build just in time)")
    args = parse_args(["--out", str(tmp_path / "out")])
    write_profile(args, tmp_path / "work")
    result = run_case(case, args, tmp_path / "work")
    assert not result.error, result.error
    assert result.trains, f"loss did not fall: {result.loss_first} -> {result.loss_last}"
    assert result.resume_bitwise, f"resumed export differs from the uninterrupted one by {result.resume_max_abs_diff}"
    assert result.export_loads
