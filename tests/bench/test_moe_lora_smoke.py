"""bench/suites/gpu_moe_lora.py --cpu-smoke end to end: the layer table of every experts implementation, our tiny
Qwen3-MoE expert-LoRA run through the comparison's machinery (the TRL peer cannot run here: its failure is
recorded beside ours), the tiny gpt-oss run, one results file, and the table printed last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.suites.gpu_moe_lora import TARGETS
from tests.bench import results_checks as checks

@pytest.mark.slow
def test_cpu_smoke_runs_every_phase_and_writes_one_results_file(tmp_path: Path) -> None:
    results, stdout = checks.run_cpu_smoke("bench.suites.gpu_moe_lora", tmp_path)
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
    train_log = (tmp_path / "out" / "ours-0" / "ours-moe-lora" / "train.log").read_text()
    assert "LoRA on the experts: 4 stacked expert weights" in train_log
    assert stdout.rstrip().splitlines()[-1].startswith("| gpt-oss-20b ours | 1 |")
