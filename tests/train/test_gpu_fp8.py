"""FP8 training on one FP8 GPU (compute capability >= 8.9), FSDP2 world size 1: a run stopped at step 6
and resumed in a fresh process ends with the weights of an uninterrupted run, bit for bit, and its
export is a plain Hugging Face model (no float8 tensors) that `from_pretrained` loads.

Skipped without such a GPU (CI has none). On the GPU machine:
    python -m pytest -q tests/train/test_gpu_fp8.py

As in test_gpu_fsdp2_resume.py, the run avoids the kernels that accumulate with atomics (eager attention,
padded batches, no compile, the dense loss) and runs with deterministic kernels: under test is the
checkpoint of a model whose decoder linears are float8 linears (ours for tensorwise, torchao's for its recipes).
"""

from __future__ import annotations

import pytest
import torch

from tests.faults import STOP_AT_STEP_ENV
from tests.train.run_helpers import exported_tensors, metrics, read_log, run_training, write_run
from tests.train.test_gpu import DETERMINISTIC_ENV, GPU_ARCH
from train.engine.checkpoint import MARKER

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                                reason="needs a GPU with FP8 tensor cores (compute capability >= 8.9)")

STEPS, STOP_AT = 12, 6
CONFIG = {
    "model": {"arch": GPU_ARCH, "attn_implementation": "eager", "precision": "bf16"},
    "data": {"tokens_per_micro_batch": 2048, "packing": False},
    "train": {"max_steps": STEPS, "save_steps": 1000, "logging_steps": 1, "compile": False, "fused_loss": False,
              "gradient_checkpointing": True, "deterministic": True, "precision": "fp8"},
}


def _fp8_run(path, recipe: str, fast_accum: bool):
    train = {**CONFIG["train"], "fp8_recipe": recipe, "fp8_fast_accum": fast_accum}
    run = write_run(path, {**CONFIG, "train": train}, processes=1)
    yaml = run / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("mixed_precision: 'no'", "mixed_precision: 'bf16'"))
    return run


@pytest.mark.parametrize(("recipe", "fast_accum"), [("tensorwise", False), ("tensorwise", True),
                                                    ("torchao-tensorwise", False), ("rowwise", False)])
def test_fp8_resume_is_bitwise_and_exports_a_plain_model(tmp_path, recipe: str, fast_accum: bool):
    reference = _fp8_run(tmp_path / "reference", recipe, fast_accum)
    assert run_training(reference, DETERMINISTIC_ENV, timeout=400) == 0, read_log(reference)
    accumulation = "fast" if fast_accum else "fp32"
    assert (f"FP8 ({recipe} scaling, {accumulation} forward accumulation): 14 linear layers of 2 decoder layers "
            "in float8") in read_log(reference)

    run = _fp8_run(tmp_path / "run", recipe, fast_accum)
    first = run_training(run, {**DETERMINISTIC_ENV, STOP_AT_STEP_ENV: str(STOP_AT)}, timeout=400)
    assert first != 0 and "exitcode  : 75" in read_log(run), read_log(run)
    assert (run / "checkpoints" / f"step-{STOP_AT:08d}" / MARKER).is_file(), read_log(run)
    assert run_training(run, DETERMINISTIC_ENV, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")

    got, want = exported_tensors(run), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    differing = [name for name in want if not torch.equal(got[name], want[name])]
    assert not differing, f"resumed FP8 run differs in {len(differing)} tensors, e.g. {differing[:3]}"
    assert {r["step"]: r["loss"] for r in metrics(run) if "loss" in r} == \
        {r["step"]: r["loss"] for r in metrics(reference) if "loss" in r}

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "export")
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # a stock model, no torchao class
    assert all(not t.dtype.is_floating_point or t.dtype in (torch.float32, torch.bfloat16) for t in got.values())
