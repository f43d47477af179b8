"""bench/suites/gpu_moe_lora.py --cpu-smoke end to end: the layer table of every experts implementation, our tiny
Qwen3-MoE expert-LoRA run through the comparison's machinery (the TRL peer cannot run here: its failure is
recorded beside ours), the tiny gpt-oss run, one results file, and the table printed last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.suites.gpu_moe_lora import TARGETS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_smoke_runs_every_phase_and_writes_one_results_file(tmp_path: Path) -> None:
    out, results = tmp_path / "out", tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "bench.suites.gpu_moe_lora", "--cpu-smoke", "--out", str(out),
                           "--results", str(results)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in results.iterdir()] == ["moelora-tiny-moe.json"]
    record = json.loads((results / "moelora-tiny-moe.json").read_text())
    layer = {row["row"]: row for row in record["layer"]["rows"]}
    assert {"experts eager", "experts sft_grouped", "LoRA r16 on the experts: PEFT fold",
            "LoRA r16 on the experts: ours"} <= layer.keys()
    assert all("ms" in layer[name] for name in ("experts sft_grouped", "LoRA r16 on the experts: ours"))
    ours, peer = record["sides"]["ours"]["runs"], record["sides"]["peer"]["runs"]
    assert record["order"] == ["peer", "ours"] and record["lora_targets"] == TARGETS
    assert ours[0]["real_tokens_per_s"] > 0 and ours[0]["lora_params"] > 0 and ours[0]["windows"]
    assert "error" in peer[0] and record["ratio_median"] is None  # no trl here
    assert record["gpt_oss"]["real_tokens_per_s"] > 0
    train_log = (out / "ours-0" / "ours-moe-lora" / "train.log").read_text()
    assert "LoRA on the experts: 4 stacked expert weights" in train_log
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| gpt-oss-20b ours | 1 |")
