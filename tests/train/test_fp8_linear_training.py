"""Our float8 linears (train.fp8_recipe = "tensorwise", train/kernels/fp8_linear.py) in training on 2 gloo ranks
under FSDP2, pretrained weights read by rank 0 and broadcast while sharding, as rendered. FP8 runs on the CPU
here (torch._scaled_mm and the torch reference cast; only the GPU check is faked, tests/faults FP8_ON_CPU_ENV;
tests/train/test_gpu_fp8.py runs the Triton cast on an FP8 GPU). The loss falls, a run stopped at a step and
resumed ends bitwise equal to an uninterrupted one, and the export is a plain Hugging Face model."""

from __future__ import annotations

from tests.train.run_helpers import read_log, run_training
from tests.train.test_export_lora import _save_base
from tests.train.test_float8_all_gather import FP8, STEPS, fp8_run, losses_by_step, stopped_run_resumes_bitwise


def test_our_float8_linears_train_and_resume_bitwise_under_fsdp2(tmp_path) -> None:
    base = tmp_path / "base"
    _save_base(base)
    reference = fp8_run(tmp_path / "reference", base, "tensorwise")
    assert run_training(reference, FP8, timeout=400) == 0, read_log(reference)
    assert "in float8 (ours); fused SwiGLU MLP off; weights all-gathered in bf16" in read_log(reference)
    losses = losses_by_step(reference)
    assert len(losses) == STEPS and losses[STEPS][0] < losses[1][0]

    stopped_run_resumes_bitwise(fp8_run(tmp_path / "run", base, "tensorwise"), reference)
