"""FSDP2 on one GPU (world size 1, bf16): stop at step 6 → sharded checkpoint → resume in a fresh
process → the final weights equal an uninterrupted run's bit for bit.

Skipped without CUDA (CI has no GPU). On the GPU machine:
    python -m pytest -q tests/train/test_gpu_fsdp2_resume.py
To check the test's logic on a CPU host (FSDP2 over gloo, slow):
    SFT_TEST_FSDP2_RESUME_ON_CPU=1 python -m pytest -q tests/train/test_gpu_fsdp2_resume.py

Bitwise equality needs run-to-run determinism, so the run avoids the GPU kernels that accumulate
with atomics (flash / memory-efficient attention backward): padded batches with eager attention,
no torch.compile, the dense loss. What is under test is the FSDP2 checkpoint (DCP model and
optimizer shards, RNG, scheduler, data position), not those kernels (tests/train/test_gpu.py runs them).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.train.conftest import TINY_ARCH
from tests.train.run_helpers import assert_sharded_checkpoint, exported_tensors, metrics, read_log, run_training, write_run
from tests.train.test_gpu import DETERMINISTIC_ENV, GPU_ARCH
from train.engine.checkpoint import MARKER
from tests.faults import STOP_AT_STEP_ENV as TEST_STOP_AT_STEP_ENV

ON_CPU = os.environ.get("SFT_TEST_FSDP2_RESUME_ON_CPU") == "1"
pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not ON_CPU,
                                reason="needs a CUDA GPU (none on CI); SFT_TEST_FSDP2_RESUME_ON_CPU=1 runs it on CPU")

STEPS, STOP_AT = 12, 6
CONFIG = {
    # On CPU (bf16 matmuls are slow there) the tiny model and short batches: the logic is the same.
    "model": {"arch": TINY_ARCH if ON_CPU else GPU_ARCH, "attn_implementation": "eager", "precision": "bf16"},
    "data": {"tokens_per_micro_batch": 256 if ON_CPU else 2048, "packing": False},
    "train": {"max_steps": STEPS, "save_steps": 1000, "logging_steps": 1, "compile": False, "fused_loss": False,
              "gradient_checkpointing": True},
}


def _fsdp2_bf16_run(path):
    run = write_run(path, CONFIG, processes=1)
    yaml = run / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("mixed_precision: 'no'", "mixed_precision: 'bf16'"))
    return run


def _differing(run, reference) -> list[str]:
    got, want = exported_tensors(run), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    return [name for name in want if not torch.equal(got[name], want[name])]


def test_fsdp2_one_gpu_bf16_resume_is_bitwise(tmp_path):
    reference = _fsdp2_bf16_run(tmp_path / "reference")
    assert run_training(reference, DETERMINISTIC_ENV, timeout=400) == 0, read_log(reference)
    assert "world size 1 (DistributedType.FSDP)" in read_log(reference)

    run = _fsdp2_bf16_run(tmp_path / "run")
    first = run_training(run, {**DETERMINISTIC_ENV, TEST_STOP_AT_STEP_ENV: str(STOP_AT)}, timeout=400)
    assert first != 0 and "exitcode  : 75" in read_log(run), read_log(run)
    checkpoint = run / "checkpoints" / f"step-{STOP_AT:08d}"
    assert (checkpoint / MARKER).is_file(), read_log(run)
    assert_sharded_checkpoint(checkpoint, world=1)
    assert not (run / "export").exists()

    assert run_training(run, DETERMINISTIC_ENV, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")
    assert f"step-{STOP_AT:08d} (step {STOP_AT}" in read_log(run, "resume.log")
    differing = _differing(run, reference)
    if differing:  # tell a resume bug from a nondeterministic GPU: a second uninterrupted run
        control = _fsdp2_bf16_run(tmp_path / "control")
        assert run_training(control, DETERMINISTIC_ENV, timeout=400) == 0, read_log(control)
        assert not _differing(control, reference), "two uninterrupted runs differ: the GPU run is not deterministic"
        pytest.fail(f"resumed run differs from the uninterrupted one in {len(differing)} tensors, e.g. {differing[:3]}")
    losses = {r["step"]: r["loss"] for r in metrics(run) if "loss" in r}
    assert losses == {r["step"]: r["loss"] for r in metrics(reference) if "loss" in r}
