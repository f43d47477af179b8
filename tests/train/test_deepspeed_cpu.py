"""DeepSpeed ZeRO-2 / ZeRO-3 paths of train/ on CPU (DeepSpeed's CPU accelerator over gloo, one
process): a run directory rendered by the CLI for a 1-GPU profile trains, checkpoints mid-way,
resumes in a fresh directory from that checkpoint to the same weights bit for bit, and exports a
model that from_pretrained loads. The GPU runs of the same cases: bench/gpu_strategies.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.strategy_checks import compare_exports, export_loads
from contract.protocol import free_port
from tests.launcher.conftest import cli_env, write_run
from tests.train.run_helpers import REPO

pytest.importorskip("deepspeed", reason="deepspeed not installed (extra: deepspeed)")
pytestmark = pytest.mark.slow

PROFILE = '[profiles.gpu1]\ngpus_per_node = 1\ngpu_type = "h100"\nstorage_root = "{root}"\ntime = "1:00:00"\nsignal_lead_s = 60\n'
SETS = ["train.max_steps=4", "train.save_steps=2", "train.gradient_accumulation_steps=2", "train.logging_steps=1",
        "train.compile=false", "train.learning_rate=1e-3", "data.tokens_per_micro_batch=256",
        "model.attn_implementation=sdpa", "lora.merge_on_export=true",
        "train.fused_loss=fused"]  # the CUDA default loss (eager here), as a GPU run takes it under ZeRO


def render(tmp_path: Path, run_dir: Path, strategy: str, lora: bool) -> None:
    (tmp_path / "cluster.toml").write_text(PROFILE.format(root=tmp_path))
    args = ["--executor", "local", "--cluster", str(tmp_path / "cluster.toml"), "--profile", "gpu1",
            "--model", "tiny", "--strategy", strategy, "--output", str(run_dir)] + (["--lora"] if lora else [])
    for item in SETS:
        args += ["--set", item]
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", *args, "--dry-run"], cwd=REPO, env=cli_env(),
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr  # the launch's checks; a dry run writes no run directory
    write_run(args)


def train_on_cpu(run_dir: Path) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "train" / "workers" / "deepspeed_cpu.py"),
                           str(run_dir), str(free_port())], cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize(("strategy", "lora"), [("zero2", True), ("zero3", False), ("zero3", True)])
def test_zero_trains_resumes_bitwise_and_exports(tmp_path, strategy, lora):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    render(tmp_path, reference, strategy, lora)
    train_on_cpu(reference)
    render(tmp_path, resumed, strategy, lora)
    shutil.copytree(reference / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    log = train_on_cpu(resumed)
    assert "resumed from" in log and "(step 2," in log
    bitwise, worst = compare_exports(reference / "export", resumed / "export")
    assert bitwise, f"resumed weights differ from the uninterrupted run's by up to {worst}"
    export_loads(reference / "export")
