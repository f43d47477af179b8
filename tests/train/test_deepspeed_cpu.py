"""DeepSpeed ZeRO-2 / ZeRO-3 paths of train/ on CPU: a run directory rendered by the CLI for a 2-GPU
profile is started by `accelerate launch` with its rendered accelerate.yaml (2 processes; DeepSpeed's
CPU accelerator over gloo, the rendered deepspeed.json). The loss drops, the optimizer state is
partitioned over both ranks, the export differs from the initial weights in every projection,
a run resumed in a fresh directory from the mid-way checkpoint ends on the same weights bit for bit,
and the export loads with from_pretrained. The GPU runs of the same cases: bench/suites/gpu_strategies.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.suites.strategy_checks import compare_exports, export_loads
from contract.protocol import free_port
from tests.launcher.conftest import cli_env, path_without, write_run
from tests.train.run_helpers import REPO

pytest.importorskip("deepspeed", reason="deepspeed not installed (extra: deepspeed)")
pytestmark = pytest.mark.slow

PROFILE = '[profiles.gpu2]\ngpus_per_node = 2\ngpu_type = "h100"\nstorage_root = "{root}"\ntime = "1:00:00"\nsignal_lead_s = 60\n'
STEPS, SAVE_AT = 8, 4
SETS = [f"train.max_steps={STEPS}", f"train.save_steps={SAVE_AT}", "train.gradient_accumulation_steps=2",
        "train.logging_steps=1", "train.compile=false", "train.learning_rate=3e-3", "data.tokens_per_micro_batch=256",
        "model.attn_implementation=sdpa", "lora.merge_on_export=true",
        "train.fused_loss=fused"]  # the CUDA default loss (eager here), as a GPU run takes it under ZeRO


def render(tmp_path: Path, run_dir: Path, strategy: str, lora: bool) -> None:
    (tmp_path / "cluster.toml").write_text(PROFILE.format(root=tmp_path))
    args = ["--cluster", str(tmp_path / "cluster.toml"), "--profile", "gpu2",
            "--model", "tiny", "--strategy", strategy, "--output", str(run_dir)] + (["--lora"] if lora else [])
    for item in SETS:
        args += ["--set", item]
    # The launch's checks, as on a login node (--executor local refuses a GPU profile where no GPU is seen);
    # a dry run writes no run directory.
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", *args, "--dry-run"], cwd=REPO,
                          env=cli_env(PATH=path_without("sbatch")), capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    write_run(["--executor", "local", *args])


def train_on_cpu(run_dir: Path) -> str:
    """`accelerate launch` with the rendered accelerate.yaml (2 processes) on the worker."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run_dir / "accelerate.yaml"),
           "--main_process_port", str(free_port()), str(REPO / "tests" / "train" / "workers" / "deepspeed_cpu.py"),
           str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def losses(run_dir: Path) -> dict[int, float]:
    records = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def projection_changes(run_dir: Path) -> dict[str, bool]:
    """For every q/k/v/o/gate/up/down weight of the export: does it differ from the initial weights
    the worker saved (LoRA: the base weight the adapter was merged into)?"""
    from safetensors.torch import load_file

    initial = {name.removeprefix("base_model.model.").replace(".base_layer", ""): tensor
               for name, tensor in load_file(run_dir / "initial.safetensors").items()}
    exported = load_file(run_dir / "export" / "model.safetensors")
    names = [name for name in exported if name.endswith("proj.weight")]
    assert len(names) == 7 * 2 and all(name in initial for name in names), sorted(initial)[:8]
    return {name: not torch.equal(exported[name].float(), initial[name]) for name in names}


@pytest.mark.parametrize(("strategy", "lora"), [("zero2", False), ("zero3", False), ("zero3", True)])
def test_zero_on_two_processes_learns_partitions_resumes_bitwise_and_exports(tmp_path, strategy, lora):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    render(tmp_path, reference, strategy, lora)
    log = train_on_cpu(reference)
    assert "world size 2 (DistributedType.DEEPSPEED)" in log, log[-3000:]
    # train.async_save's default (true, rendered) under DeepSpeed: synchronous saves, one line saying why.
    assert "train.async_save: checkpoints are written synchronously (DEEPSPEED" in log, log[-3000:]
    curve = losses(reference)
    assert curve[STEPS] < curve[1] - 0.2, f"the loss does not drop: {curve}"
    checkpoint = reference / "checkpoints" / f"step-{SAVE_AT:08d}"
    shards = sorted(p.name for p in checkpoint.rglob("*zero_pp_rank_*optim_states.pt"))
    assert len(shards) == 2 and any("rank_0_" in n for n in shards) and any("rank_1_" in n for n in shards), shards
    changed = projection_changes(reference)
    assert all(changed.values()), f"exported like the initial weights: {[n for n, c in changed.items() if not c]}"

    render(tmp_path, resumed, strategy, lora)
    shutil.copytree(checkpoint, resumed / "checkpoints" / checkpoint.name)
    log = train_on_cpu(resumed)
    assert "resumed from" in log and f"(step {SAVE_AT}," in log
    bitwise, worst = compare_exports(reference / "export", resumed / "export")
    assert bitwise, f"resumed weights differ from the uninterrupted run's by up to {worst}"
    export_loads(reference / "export")
