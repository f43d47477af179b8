"""The one rule for where the fused SwiGLU MLP (train.fused_mlp) may run, shared by the login-node
check (launcher/resolve/options.py) and the compute node (train/kernels/swiglu.py)."""

from __future__ import annotations

import pytest

from contract.gpus import GPUS, fused_mlp_blocker


@pytest.mark.parametrize(("gpu", "allowed"), [("a100", False), ("l40s", False), ("h100", True), ("h200", True),
                                              ("gh200", True), ("b200", True)])
def test_gpu_generations(gpu: str, allowed: bool) -> None:
    blocker = fused_mlp_blocker(True, GPUS[gpu].compute_capability, lora=False, zero_stage=None)
    assert (blocker is None) == allowed, blocker
    if not allowed:
        assert "needs Hopper or Blackwell" in blocker


def test_cpu_lora_and_zero3_are_refused_with_the_reason() -> None:
    assert fused_mlp_blocker(False, None, lora=False, zero_stage=None) == "it runs only on CUDA GPUs"
    assert "LoRA is on" in fused_mlp_blocker(True, (9, 0), lora=True, zero_stage=None)
    assert "ZeRO-3" in fused_mlp_blocker(True, (9, 0), lora=False, zero_stage=3)
    assert fused_mlp_blocker(True, (9, 0), lora=False, zero_stage=2) is None


def test_an_unknown_gpu_is_left_to_the_compute_node() -> None:
    assert fused_mlp_blocker(True, None, lora=False, zero_stage=None) is None
