"""train.fp8_all_gather on 2 gloo ranks (FSDP2; pretrained weights read by rank 0 alone and broadcast while
sharding, as rendered): FP8 runs on the CPU here
(torch._scaled_mm; only the GPU check is faked, tests/faults FP8_ON_CPU_ENV). The float8 all-gather
trains exactly as the bf16 all-gather does (fp32 here: the same tensorwise scales, so the same float8
weights), a run stopped at a step and resumed ends bitwise equal to an uninterrupted one, the export is
a plain Hugging Face model, and rowwise scaling is refused in one line."""

from __future__ import annotations

import subprocess
import sys

import torch

from contract.failure import first_failure
from tests.faults import FP8_ON_CPU_ENV, STOP_AT_STEP_ENV
from tests.train.run_helpers import REPO, exported_tensors, launch_env, metrics, read_log, run_training, write_run
from tests.train.test_export_lora import _save_base
from train.engine.checkpoint import MARKER

STEPS, STOP_AT = 8, 4
FP8 = {FP8_ON_CPU_ENV: "1"}


def fp8_run(path, base, recipe: str, all_gather: bool = False):
    return write_run(path, {"model": {"path": str(base)}, "train": {"precision": "fp8", "fp8_recipe": recipe,
                                      "fp8_all_gather": all_gather, "max_steps": STEPS,
                                      "logging_steps": 1, "gradient_accumulation_steps": 1, "fused_loss": False}})


def losses_by_step(run) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in metrics(run) if "loss" in r}


def test_float8_all_gather_trains_as_bf16_all_gather_and_resumes_bitwise(tmp_path) -> None:
    base = tmp_path / "base"
    _save_base(base)
    reference = fp8_run(tmp_path / "reference", base, "tensorwise", all_gather=True)
    assert run_training(reference, FP8, timeout=400) == 0, read_log(reference)
    assert "in float8 (torchao's Float8Linear); fused SwiGLU MLP off; weights all-gathered in float8" in read_log(reference)
    plain = fp8_run(tmp_path / "bf16-all-gather", base, "torchao-tensorwise")  # torchao's too
    assert run_training(plain, FP8, timeout=400) == 0, read_log(plain)
    # Every float8 weight updated once per step (Accelerate's optimizer mapping lost 13 of 14 of them).
    assert losses_by_step(reference) == losses_by_step(plain) and len(losses_by_step(reference)) == STEPS
    assert losses_by_step(reference)[STEPS][0] < losses_by_step(reference)[1][0]

    run = fp8_run(tmp_path / "run", base, "tensorwise", all_gather=True)
    got = stopped_run_resumes_bitwise(run, reference)
    assert all(t.dtype in (torch.float32, torch.bfloat16) for t in got.values() if t.dtype.is_floating_point)


def stopped_run_resumes_bitwise(run, reference) -> dict[str, torch.Tensor]:
    """Stop `run` at step STOP_AT (exit 75) and resume it: its losses and export equal the uninterrupted
    `reference`'s bit for bit, and the export loads as a stock model. Returns the exported tensors."""
    first = run_training(run, {**FP8, STOP_AT_STEP_ENV: str(STOP_AT)}, timeout=400)
    assert first != 0 and "exitcode  : 75" in read_log(run), read_log(run)
    assert (run / "checkpoints" / f"step-{STOP_AT:08d}" / MARKER).is_file(), read_log(run)
    assert run_training(run, FP8, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")
    assert losses_by_step(run) == losses_by_step(reference)
    got, want = exported_tensors(run), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    differing = [name for name in want if not torch.equal(got[name], want[name])]
    assert not differing, f"resumed run differs in {len(differing)} tensors, e.g. {differing[:3]}"

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "export")
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear  # a stock model, no float8 class
    return got


def test_rowwise_with_float8_all_gather_is_refused_in_one_line(tmp_path) -> None:
    run = write_run(tmp_path / "run", {"train": {"precision": "fp8", "fp8_recipe": "rowwise", "fp8_all_gather": True,
                                                 "max_steps": 2}}, processes=1)
    proc = subprocess.run([sys.executable, "-m", "train", "--config", str(run / "train.toml")], cwd=REPO,
                          env=launch_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = first_failure(run)
    assert record is not None and record["exit_code"] == 2, record
    assert record["message"].startswith("train.fp8_all_gather: the float8 all-gather needs train.fp8_recipe = "
                                        "tensorwise"), record["message"]
    assert "\n" not in record["message"]
    assert not (run / "checkpoints").exists() and not (run / "export").exists()
