"""bench/gpu_parity.py end to end on CPU (--cpu-smoke: tiny shape, 6 steps): corpus, one initial
checkpoint, our default path (and TRL's SFTTrainer where trl is installed) from it, the shared eval
scorer, the table, and a results file that tests/bench/test_results.py's parity checks accept."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

from bench.gpu_parity import comparisons

REPO = Path(__file__).resolve().parents[2]


def test_cpu_smoke_trains_scores_and_writes_a_results_file(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.gpu_parity", "--cpu-smoke", "--out", str(tmp_path / "out"),
                           "--results", str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| side | eval loss | vs |" in proc.stdout
    record = json.loads((tmp_path / "results" / "parity-tiny.json").read_text())
    ours = record["sides"]["ours"]
    assert len(ours["losses"]) == record["steps"] == 6 and math.isfinite(ours["eval_loss"])
    assert ours["eval_loss"] < math.log(2048)  # below uniform over the tiny vocabulary: it learned something
    assert record["comparisons"] == comparisons(record["sides"]) and "provenance" in record
    if importlib.util.find_spec("trl") is not None:  # same init, data and schedule: the same eval loss
        (judged,) = record["comparisons"]
        assert judged["side"] == "ours" and judged["reference"] == "trl" and judged["within_target"], judged
