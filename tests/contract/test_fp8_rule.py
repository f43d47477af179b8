"""The one rule for where FP8 training (train.precision = "fp8") may run, shared by the login-node check
(launcher/resolve/options.py) and the compute node (train/kernels/float8.py), and the GPU table's FP8 peaks."""

from __future__ import annotations

import pytest

from contract.gpus import GPUS, fp8_blocker


@pytest.mark.parametrize(("gpu", "allowed"), [("v100", False), ("a100", False), ("a10g", False), ("l4", True),
                                              ("l40s", True), ("h100", True), ("h200", True), ("b200", True)])
def test_gpu_generations(gpu: str, allowed: bool) -> None:
    blocker = fp8_blocker(True, GPUS[gpu].compute_capability)
    assert (blocker is None) == allowed, blocker
    if not allowed:
        assert "compute capability >= 8.9" in blocker and "this GPU has" in blocker
    # Every GPU that can run FP8 has its FP8 peak in the table (the planner prints it beside the bf16 one).
    assert (GPUS[gpu].peak_tflops_fp8 is not None) == allowed


def test_cpu_is_refused_and_an_unknown_gpu_is_left_to_the_compute_node() -> None:
    assert "CUDA GPU" in fp8_blocker(False, None)
    assert fp8_blocker(True, None) is None


def test_fp8_peak_is_twice_the_dense_bf16_peak_on_hopper() -> None:
    for name in ("h100", "h200", "gh200"):
        assert GPUS[name].peak_tflops_fp8 == pytest.approx(2 * GPUS[name].peak_tflops_bf16, rel=0.01)
