"""Our float8 linears (train.fp8_recipe = "tensorwise", train/kernels/fp8_linear.py) in training on 2 gloo ranks
under FSDP2, pretrained weights read by rank 0 and broadcast while sharding, as rendered. FP8 runs on the CPU
here (torch._scaled_mm and the torch reference cast; only the GPU check is faked, tests/faults FP8_ON_CPU_ENV;
tests/train/test_gpu_fp8.py runs the Triton cast on an FP8 GPU). The loss falls, a run stopped at a step and
resumed ends bitwise equal to an uninterrupted one, and the export is a plain Hugging Face model."""

from __future__ import annotations

import torch

from tests.faults import FP8_ON_CPU_ENV, STOP_AT_STEP_ENV
from tests.train.run_helpers import exported_tensors, metrics, read_log, run_training, write_run
from tests.train.test_export_lora import _save_base
from train.engine.checkpoint import MARKER

STEPS, STOP_AT = 8, 4
FP8 = {FP8_ON_CPU_ENV: "1"}


def _run(path, base):
    return write_run(path, {"model": {"path": str(base)}, "train": {"precision": "fp8", "fp8_recipe": "tensorwise",
                                                                      "max_steps": STEPS, "logging_steps": 1,
                                                                      "gradient_accumulation_steps": 1, "fused_loss": False}})


def _losses(run) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in metrics(run) if "loss" in r}


def test_our_float8_linears_train_and_resume_bitwise_under_fsdp2(tmp_path) -> None:
    base = tmp_path / "base"
    _save_base(base)
    reference = _run(tmp_path / "reference", base)
    assert run_training(reference, FP8, timeout=400) == 0, read_log(reference)
    assert "in float8 (ours); fused SwiGLU MLP off; weights all-gathered in bf16" in read_log(reference)
    losses = _losses(reference)
    assert len(losses) == STEPS and losses[STEPS][0] < losses[1][0]

    run = _run(tmp_path / "run", base)
    first = run_training(run, {**FP8, STOP_AT_STEP_ENV: str(STOP_AT)}, timeout=400)
    assert first != 0 and "exitcode  : 75" in read_log(run), read_log(run)
    assert (run / "checkpoints" / f"step-{STOP_AT:08d}" / MARKER).is_file(), read_log(run)
    assert run_training(run, FP8, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")
    assert _losses(run) == losses
    got, want = exported_tensors(run), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    differing = [name for name in want if not torch.equal(got[name], want[name])]
    assert not differing, f"resumed run differs in {len(differing)} tensors, e.g. {differing[:3]}"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "export")
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # a stock model, no float8 class
