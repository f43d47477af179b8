"""bench/multi/gpu_qlora.py `match` end to end on CPU (--cpu-smoke: tiny QLoRA shape, 4 steps, gloo): both runs
start from the run directory the launcher renders (its accelerate.yaml template, not one of the bench's
own) with the local executor's command, and 2 processes match 1 process with twice the accumulation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cpu_smoke_runs_the_launchers_run_directory(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.multi.gpu_qlora", "match", "--cpu-smoke", "--out", str(tmp_path),
                           "--results", str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "results" / "qlora-1gpu-vs-2gpu.json").read_text())
    assert record["met"] and len(record["two"]["losses"]) == 4, record
    for run in ("qlora-2gpu", "qlora-1gpu"):
        assert (tmp_path / run / "accelerate.yaml").read_text().startswith("# Rendered by sft-launch")
        assert (tmp_path / run / "run.json").exists()  # written by launcher.execute.render.write_run_dir
    assert any("NF4" in line for line in record["two"]["load_log"])  # read from the ranks' logs


def test_llama70b_lora_bf16_cpu_smoke_draws_the_model_per_shard(tmp_path: Path) -> None:
    """`llama70b --lora-bf16` (the 4-GPU bf16 LoRA run, here 2 CPU processes): the rendered run has no model
    path and model.init = "sharded", trains eagerly, and writes its results file with MFU fields and the plan; with
    --checkpoint-layers, train.checkpoint_layers is rendered, recorded and applied."""
    import tomllib

    proc = subprocess.run([sys.executable, "-m", "bench.multi.gpu_qlora", "llama70b", "--lora-bf16", "--gpus", "2",
                           "--checkpoint-layers", "1", "--cpu-smoke", "--out", str(tmp_path),
                           "--results", str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "lora-bf16-llama70b-2gpu"
    toml = tomllib.loads((run / "train.toml").read_text())
    assert toml["model"]["init"] == "sharded" and toml["model"]["path"] == "" and toml["train"]["compile"] is False
    assert toml["lora"]["enabled"] and toml["lora"]["quant"] == "none"
    assert toml["train"]["gradient_checkpointing"] and toml["train"]["checkpoint_layers"] == 1
    record = json.loads((tmp_path / "results" / "lora-bf16-llama70b-2gpu.json").read_text())
    assert record["gpu_count"] == 2 and len(record["losses"]) == 2 and record["peer"] == "none", record
    assert record["ratio_vs_peer"] is None and record["plan"]["verdict"] == "fits" and "mfu" in record
    logs = "".join(p.read_text() for p in run.glob("logs/ranks/*/rank-*.log"))
    assert "rank 0: random init drawn per shard" in logs, logs[-3000:]
    assert "checkpointing 1 of 2 decoder layers (train.checkpoint_layers)" in logs, logs[-3000:]
    assert (record["gradient_checkpointing"], record["checkpoint_layers"]) == (True, 1)
    assert any("drawn per shard" in line for line in record["load_log"]), record["load_log"]
