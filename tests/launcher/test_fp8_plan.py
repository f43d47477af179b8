"""--precision fp8 on the login node: refused in one line (exit 2) where it cannot run (CPU, GPUs without
FP8, LoRA/QLoRA, DeepSpeed/FSDP1), and planned where it can: train.toml carries it, the plan says
"fp8 linears", counts the float8 casts and prints the FP8 peak beside the bf16 one MFU is measured against."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config import load_train_config
from launcher.execute.render import render_files
from launcher.plan.activations import float8_cast_bytes
from launcher.plan.plan_format import format_plan
from launcher.plan.planner import make_plan, memory_options
from launcher.resolve.options import LaunchRequest, resolve
from launcher.resolve.plan_input import plan_input_from_launch
from contract.shape import ModelShape
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli

H100_CLUSTER = """default_profile = "h100"
[profiles.h100]
gpus_per_node = 8
gpu_type = "h100"
partition = ""
storage_root = "runs"
time = "4:00:00"
"""


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("sft-launch: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "says"), [
    (["--profile", "a100", "--model", "llama3-8b"], "compute capability >= 8.9"),
    (["--profile", "cpu", "--model", "tiny"], "this is a CPU run"),
    (["--profile", "a100", "--model", "llama3-8b", "--lora"], "not with LoRA or QLoRA"),
    (["--profile", "a100", "--model", "llama3-8b", "--qlora"], "not with LoRA or QLoRA"),
    (["--profile", "a100", "--model", "llama3-8b", "--fused_mlp", "true"], "train.fused_mlp = true"),
])
def test_refused_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    result = run_cli(["plan", "--cluster", str(EXAMPLE_CLUSTER), *args, "--precision", "fp8"], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    line = _one_error_line(result)
    assert says in line and "precision" in line, line


@pytest.mark.parametrize("strategy", ["zero3", "zero2", "fsdp1"])
def test_refused_outside_fsdp2(tmp_path: Path, strategy: str) -> None:
    (tmp_path / "cluster.toml").write_text(H100_CLUSTER)
    result = run_cli(["plan", "--model", "llama3-8b", "--precision", "fp8", "--strategy", strategy], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert f"needs --strategy fsdp (FSDP2 shards torchao's float8 linears), not {strategy}" in _one_error_line(result)


def _h100_launch(tmp_path: Path, *flags: str):
    (tmp_path / "cluster.toml").write_text(H100_CLUSTER)
    train_flags = {"precision": "fp8", **dict(zip(flags[::2], flags[1::2]))}
    return resolve(LaunchRequest(model="llama3-8b", cluster=str(tmp_path / "cluster.toml"),
                                 output=str(tmp_path / "run"), dry_run=True, train_flags=train_flags))


def test_fp8_reaches_train_toml_and_the_plan(tmp_path: Path) -> None:
    launch = _h100_launch(tmp_path, "fp8_recipe", "rowwise")
    files = render_files(launch)
    (tmp_path / "train.toml").write_text(files["train.toml"])
    written = load_train_config(tmp_path / "train.toml").train
    assert (written.precision, written.fp8_recipe) == ("fp8", "rowwise")
    inp = plan_input_from_launch(launch)
    assert inp.fp8 == "torchao" and inp.precision == "bf16"  # rowwise is torchao's (contract.config.fp8_linears)
    (tmp_path / "default").mkdir()
    assert plan_input_from_launch(_h100_launch(tmp_path / "default")).fp8 == "ours"  # tensorwise
    assert not inp.fused_mlp, "fused_mlp = auto stays off under FP8 (its float8 linears are the MLP's)"
    text = format_plan(make_plan(inp))
    assert "fp8 linears + bf16" in text
    assert "MFU against the bf16 peak (989 TFLOP/s per GPU); FP8 peak 1,979 TFLOP/s" in text


def test_the_float8_casts_are_planned_memory(tmp_path: Path) -> None:
    inp = plan_input_from_launch(_h100_launch(tmp_path))
    inp.compile = False  # eager: the same saved tensors in bf16 and fp8 (compiled, fp8 keeps fewer: memory.py)
    inp.gradient_checkpointing = True  # per-layer checkpointing (the launcher may pick it off: the fastest that fits)
    bf16 = make_plan(inp.__class__(**{**inp.__dict__, "fp8": False}))
    fp8 = make_plan(inp)
    casts = float8_cast_bytes(ModelShape.from_arch(inp.arch), memory_options(inp))
    assert casts > 0 and fp8.gpu.activations - bf16.gpu.activations == casts
    assert fp8.time.expected_mfu is not None  # against the bf16 peak, as every run's
