"""Gradient accumulation under FSDP2 reduce-scatters after every micro-batch (train/engine/optim.py,
`defers_gradient_sync`): between micro-batches each rank holds only its sharded gradients, as the memory
planner assumes (launcher/plan/peak.py), never the whole model's unsharded ones (what `no_sync` would keep).
Proven through the real training loop (2 gloo ranks, FSDP2 through Accelerate, a tiny random Llama): with
`no_sync`, every parameter's gradient stayed unsharded after the first micro-batch and none was sharded. The
run still trains as one process does on the same micro-batches of each step (2 ranks x 2 = 1 rank x 4; the
plan is global, rank r takes micro-batches r, r+W, ...): the same losses and gradient norms."""

from __future__ import annotations

import json
import math

import pytest

from tests.train.run_helpers import REPO, metrics, read_log, run_training, run_worker, write_run

WORKER = REPO / "tests" / "train" / "workers" / "fsdp2_accumulation.py"
TRAIN = {"max_steps": 4, "logging_steps": 1, "warmup_ratio": 0.0}


@pytest.mark.slow
def test_fsdp2_accumulation_reduce_scatters_every_micro_batch_and_trains_as_one_process(tmp_path):
    two = write_run(tmp_path / "two", {"train": {**TRAIN, "gradient_accumulation_steps": 2}})
    proc = run_worker(WORKER, two)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        records = json.loads((two / f"gradients-rank{rank}.json").read_text())
        assert len(records) == 2 * TRAIN["max_steps"] and [r["last"] for r in records[:2]] == [False, True]
        for record in records:  # the first micro-batch's backward too: nothing waits unsharded for the last
            assert record["unsharded"] == 0 and record["sharded"] == record["trainable"] > 0, (rank, records)

    one = write_run(tmp_path / "one", {"train": {**TRAIN, "gradient_accumulation_steps": 4}}, processes=1)
    assert run_training(one) == 0, read_log(one)[-4000:]
    steps = {run: {r["step"]: r for r in metrics(run) if "loss" in r} for run in (two, one)}
    assert steps[two].keys() == steps[one].keys() == set(range(1, TRAIN["max_steps"] + 1))
    for step, record in steps[two].items():
        alone = steps[one][step]
        assert math.isclose(record["loss"], alone["loss"], rel_tol=1e-5), (step, record, alone)
        assert math.isclose(record["grad_norm"], alone["grad_norm"], rel_tol=1e-4), (step, record, alone)
    assert steps[two][4]["loss"] < steps[two][1]["loss"]  # it trains: the tiny model learns within 4 steps
