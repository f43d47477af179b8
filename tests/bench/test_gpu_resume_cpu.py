"""bench/multi/gpu_resume.py on CPU (FSDP2 over gloo, 2 ranks, the tiny preset): a job that gets SIGTERM on every
process at a random step saves, resumes with the same command and ends with the uninterrupted run's weights,
bit for bit. The same code runs the 2-GPU FSDP2 / ZeRO-3 / QLoRA cases (BENCHMARKS.md, "2 GPUs")."""

from __future__ import annotations

import json

from bench.multi import gpu_resume


def test_sigterm_at_a_random_step_resumes_bitwise_on_two_ranks(tmp_path):
    out = tmp_path / "out"
    code = gpu_resume.main(["--cpu", "--gpus", "2", "--cases", "fsdp", "--steps", "12", "--seed", "3",
                            "--out", str(out), "--results", str(tmp_path), "--run-timeout", "400"])
    [row] = json.loads((tmp_path / "resume-2gpu.json").read_text())["results"]
    assert code == 0 and not row["error"], row["error"]
    stopped = int(row["stop_checkpoint"].removeprefix("step-"))
    assert row["sigterm_after_step"] <= stopped < 12, row
    assert row["interrupted_exit"] != 0 and row["resumed_exit"] == 0
    assert row["bitwise"] and row["max_abs_diff"] == 0.0
    assert "resumed from" in (out / "logs" / "fsdp.resumed.log").read_text()
