"""Context parallelism (parallel.context, train/kernels/context_parallel.py) on CPU over gloo.

- the Ulysses forward/backward on 4 ranks equals one rank's on a packed batch of documents of several lengths
  that cross the rank boundaries (loss 1e-5, gradients 1e-4), with plain replicas and under FSDP2, for the
  stock and the fused loss (tests/train/workers/context_parallel.py);
- a real 2-rank training with parallel.context = 2 (one CP group, FSDP2 over both ranks) stopped at step 2
  and resumed reproduces the uninterrupted CP run bitwise (losses, the final eval loss, exported weights);
- the batch slicing itself (single process): padding, shifted labels, whole cu_seqlens.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.protocol import EXIT_REQUEUE, free_port
from tests.faults import STOP_AT_STEP_ENV
from tests.train.run_helpers import REPO, exported_tensors, launch_env, metrics, read_log, run_training, write_run
from train.dataset.packing import collate_packed
from train.kernels.context_parallel import label_tokens, shard_packed

WORKER = Path(__file__).parent / "workers" / "context_parallel.py"


def test_shard_pads_shifts_and_keeps_the_documents():
    examples = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5, 6, 7], "labels": [4, 5, 6, 7]}]
    full = collate_packed(examples)  # 7 tokens: padded to 8 for 2 ranks
    parts = [shard_packed(full, 2, rank, filler_id=0) for rank in (0, 1)]
    assert [p["input_ids"].tolist() for p in parts] == [[[1, 2, 3, 4]], [[5, 6, 7, 0]]]
    assert [p["position_ids"].tolist() for p in parts] == [[[0, 1, 2, 0]], [[1, 2, 3, 0]]]
    # Token t's target is label t+1: rank 0's last token (4, a document's first) has its successor 5 on rank 1.
    assert [p["shift_labels"].tolist() for p in parts] == [[[2, 3, -100, 5]], [[6, 7, -100, -100]]]
    assert all(p["cu_seq_lens_q"].tolist() == [0, 3, 7, 8] for p in parts)
    assert sum(label_tokens(p) for p in parts) == label_tokens(full) == 5


@pytest.mark.slow
def test_ulysses_equals_one_rank_on_four_ranks():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "4", "--master_port",
                           str(free_port()), str(WORKER)], cwd=REPO, env=launch_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 8  # 4 ranks x 2 loss paths


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


@pytest.mark.slow
def test_context_parallel_training_resumes_bitwise(tmp_path):
    settings = {"parallel": {"context": 2}, "train": {"max_steps": 4, "logging_steps": 1},
                "data": {"eval_fraction": 0.05}}  # the final eval runs under context parallelism too
    reference = write_run(tmp_path / "reference", settings)
    assert run_training(reference) == 0, read_log(reference)
    assert "context parallel: 1 groups of 2 ranks" in read_log(reference)

    run_dir = write_run(tmp_path / "run", settings)
    code = run_training(run_dir, {STOP_AT_STEP_ENV: "2"}, log_name="first.log")
    assert code in (EXIT_REQUEUE, 1) and "exitcode  : 75" in read_log(run_dir, "first.log"), read_log(run_dir, "first.log")
    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    assert "resumed from" in read_log(run_dir, "second.log")
    assert _losses(run_dir) == _losses(reference) and len(_losses(reference)) == 4
    evals = [[r["eval_loss"] for r in metrics(d) if "eval_loss" in r] for d in (reference, run_dir)]
    assert evals[0] == evals[1] and len(evals[0]) == 1 and 0 < evals[0][0] < 10
    got, want = exported_tensors(run_dir), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    assert all(torch.equal(got[name], tensor) for name, tensor in want.items())
