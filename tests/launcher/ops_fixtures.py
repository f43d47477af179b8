"""Hand-built run directories for the run-operation tests (run.json, metrics.jsonl, checkpoints, logs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def step_record(step: int, restart: int, elapsed: float, mfu: float | None = None,
                total_steps: int = 40) -> dict[str, Any]:
    return {"step": step, "epoch": 0, "loss": 6.0 - 0.05 * step, "lr": 1e-3 * min(1.0, step / 5),
            "grad_norm": 1.0, "tokens_per_s": 1000.0 + step, "tokens_per_s_per_gpu": 500.0,
            "tflops_per_gpu": 0.01, "mfu": mfu, "peak_mem_gib": None, "packing_efficiency": 0.98,
            "elapsed_s": elapsed, "restart": restart, "total_steps": total_steps}


def make_run(root: Path, name: str = "run-a", *, job_id: str = "900042", steps_per_restart: tuple[int, ...] = (10, 8),
             max_steps: int = 40, checkpoints: tuple[int, ...] = (10, 18), incomplete: tuple[int, ...] = (20,),
             finished: bool = False, mfu: float | None = None, kinds: tuple[str, ...] = ("preemption",)) -> Path:
    """A run of job `job_id` that was requeued once per entry of `kinds`; 2 s per step."""
    run_dir = root / name
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "train.toml").write_text(f"[train]\nmax_steps = {max_steps}\n[run]\ndir = \".\"\n")
    records, events, step = [], [], 0
    for restart, count in enumerate(steps_per_restart):
        events.append({"event": "start", "job_id": job_id, "restart": restart})
        log_lines = [f"sft-launch: job {job_id} restart {restart} on node1"]
        for index in range(count):
            step += 1
            records.append(step_record(step, restart, elapsed=2.0 * (index + 1), mfu=mfu, total_steps=max_steps))
            log_lines += [f"2026-01-01 00:00:0{index % 10},000 [rank 0] INFO train.observe.metrics: step {step}/{max_steps}",
                          f"2026-01-01 00:00:0{index % 10},000 [rank 1] INFO train.engine.model: rank 1 says {step}"]
        log_lines.append("srun: error: node2: task 1: Terminated")
        (run_dir / "logs" / f"{job_id}-r{restart}.log").write_text("\n".join(log_lines) + "\n")
        if restart < len(kinds):
            events.append({"event": "requeue", "job_id": job_id, "restart": restart, "kind": kinds[restart],
                           "timeouts": sum(k == "timeout" for k in kinds[:restart + 1])})
    if finished:
        records.append({"event": "done", "step": step, "epoch": 0, "elapsed_s": 1.0})
        events.append({"event": "finish", "job_id": job_id, "exit_code": 0})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 99, "lo')
    for ckpt in checkpoints:
        (run_dir / "checkpoints" / f"step-{ckpt:08d}").mkdir(parents=True)
        (run_dir / "checkpoints" / f"step-{ckpt:08d}" / "COMPLETE").write_text("")
    for ckpt in incomplete:
        (run_dir / "checkpoints" / f"step-{ckpt:08d}").mkdir(parents=True)
    run = {"job_ids": [job_id], "events": events, "profile": {"max_timeouts": 3, "processes_per_node": 1},
           "submissions": [{"executor": "sbatch", "job_id": job_id}]}
    (run_dir / "run.json").write_text(json.dumps(run, indent=2))
    return run_dir
