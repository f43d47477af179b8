"""Rendered files checked by the real consumers: shellcheck + bash -n, Accelerate's config loader,
DeepSpeed's config class, and contract.config's own loader."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.shellcheck import shellcheck
from tests.launcher.conftest import CASES, Case, case_launch, render_case
from launcher.resolve.options import LaunchRequest, resolve
from launcher.execute.render import render_files, timeout_threshold_s, write_run_dir
from contract.config import load_train_config


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_launch_slurm_passes_shellcheck_and_bash_n(case: Case, tmp_path: Path) -> None:
    script = _write(tmp_path, "launch.slurm", render_case(case)["launch.slurm"])
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = shellcheck(script)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_sbatch_lines_are_literal(case: Case) -> None:
    lines = [line for line in render_case(case)["launch.slurm"].splitlines() if line.startswith("#SBATCH")]
    assert lines and not any("$" in line or "`" in line for line in lines)
    assert "#SBATCH --ntasks-per-node=1" in lines and "#SBATCH --requeue" in lines
    assert any(line.startswith("#SBATCH --signal=B:USR1@") for line in lines)


def test_accelerate_yaml_loads_with_accelerates_loader(case: Case, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    launch = case_launch(case)
    config = load_config_from_file(str(_write(tmp_path, "accelerate.yaml", render_case(case)["accelerate.yaml"])))
    assert config.use_cpu is False  # ARCHITECTURE.md "CPU vs GPU"
    assert config.num_processes == launch.world_size and config.num_machines == launch.nodes
    if launch.strategy in ("zero2", "zero3"):
        assert config.distributed_type.value == "DEEPSPEED"
        assert config.mixed_precision is None  # Accelerate refuses it next to deepspeed_config_file
        assert config.deepspeed_config["deepspeed_config_file"] == str(launch.run_dir / "deepspeed.json")
    else:
        assert config.distributed_type.value == "FSDP"
        assert config.fsdp_config["fsdp_version"] == (1 if launch.strategy == "fsdp1" else 2)
        assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == launch.train.model.layer_class
        expected = "no" if launch.profile.gpus_per_node == 0 else "bf16"
        assert config.mixed_precision == expected


def test_deepspeed_json_loads_with_deepspeed_config_class() -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    zero_cases = [c for c in CASES if c.strategy in ("zero2", "zero3")]
    assert zero_cases
    for case in zero_cases:
        launch = case_launch(case)
        data = json.loads(render_case(case)["deepspeed.json"])
        # Accelerate replaces the "auto" batch sizes from the dataloader; do what it does for world size 1.
        micro, accumulation = 1, launch.train.train.gradient_accumulation_steps
        data.update(train_micro_batch_size_per_gpu=micro, train_batch_size=micro * accumulation)
        config = DeepSpeedConfig(data)
        assert config.zero_optimization_stage == (3 if case.strategy == "zero3" else 2)
        assert config.bfloat16_config.enabled and config.gradient_accumulation_steps == accumulation
        offload = config.zero_config.offload_optimizer
        assert (offload is not None and offload.device == "cpu") == launch.profile.cpu_offload


def test_train_toml_reads_back_with_train_config(case: Case, tmp_path: Path) -> None:
    launch = case_launch(case, str(tmp_path / "run"))
    write_run_dir(launch, ["sft-launch", "test"])
    loaded = load_train_config(tmp_path / "run" / "train.toml")
    assert loaded.run.dir == str((tmp_path / "run").resolve())
    assert loaded.model == launch.train.model and loaded.train == launch.train.train
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(
        ["launch.slurm", "accelerate.yaml", "train.toml", "run.json", "logs", ".batch-helpers"]
        + (["deepspeed.json"] if launch.strategy in ("zero2", "zero3") else []))


@pytest.mark.parametrize(("limit_s", "expected"), [
    (86400, 69120), (3600, 2880), (1800, 1200), (720, 120), (600, 480), (300, 240), (60, 48), (1, 1)])
def test_timeout_threshold_is_min_of_80_percent_and_limit_minus_10_minutes(limit_s: int, expected: int) -> None:
    """Short limits (<= 10 min) use 0.8 x limit: the threshold is never <= 0."""
    assert timeout_threshold_s(limit_s) == expected


@pytest.mark.parametrize(("limit_s", "lead_s", "expected"), [
    (86400, 300, 69120), (3600, 300, 2880), (600, 300, 240), (600, 120, 420), (300, 280, 1)])
def test_timeout_threshold_never_after_the_time_limit_signal(limit_s: int, lead_s: int, expected: int) -> None:
    assert timeout_threshold_s(limit_s, lead_s) == expected


def test_short_time_limit_renders_a_positive_threshold(tmp_path: Path) -> None:
    launch = resolve(LaunchRequest(model="tiny", executor="local", time="5", output=str(tmp_path / "run"),
                                   sets=["profile.signal_lead_s=60"]))
    script = render_files(launch)["launch.slurm"]
    assert "TIMEOUT_AFTER_S=180\n" in script  # 5 min: min(0.8 x 300, 300 - 60 - 60)
