"""FSDP2 keeps the last decoder layer's gathered weights from its forward into its backward
(train/engine/sharding.py: keep_last_layer_gathered), as torchtitan does, so backward does not start by
all-gathering it behind lm_head's reduce-scatter on the one NCCL communicator. Proven through the real
training loop (2 gloo ranks, FSDP2 through Accelerate, a tiny random Llama): when the loss is computed only the
last layer holds gathered weights, every other layer is back to its shards; after backward none is gathered
(so the optimizer and a checkpoint see shards only). Without the call, no layer is gathered at the loss."""

from __future__ import annotations

import json

import pytest

from tests.train.run_helpers import REPO, run_worker, write_run

WORKER = REPO / "tests" / "train" / "workers" / "fsdp2_last_layer.py"


@pytest.mark.slow
def test_only_the_last_layer_stays_gathered_from_its_forward_to_its_backward(tmp_path):
    run = write_run(tmp_path / "run", {"train": {"max_steps": 2, "logging_steps": 1, "gradient_accumulation_steps": 2}})
    proc = run_worker(WORKER, run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        records = json.loads((run / f"gathered-rank{rank}.json").read_text())
        assert len(records) == 4, records  # 2 steps x 2 micro-batches
        for record in records:
            assert record["layers"] >= 2 and record["before"] == [record["layers"] - 1], (rank, records)
            assert record["after"] == [], (rank, records)
