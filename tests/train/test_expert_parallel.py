"""Expert parallelism (parallel.expert, train/kernels/expert_parallel.py) on CPU over gloo.

- a tiny Qwen3-MoE (8 experts, top-2) with its experts split over 2 and over 4 ranks (FSDP2 as training
  shards it) equals the same model on one rank with transformers' own MoE forward (EP 1): loss 1e-5,
  every gradient 1e-4, with uneven expert loads and experts that get no token (zero gradients), and an
  eval forward (tests/train/workers/expert_parallel.py);
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.protocol import free_port
from tests.train.run_helpers import REPO, launch_env

WORKER = Path(__file__).parent / "workers" / "expert_parallel.py"


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel_equals_one_rank(ranks):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                           "--master_port", str(free_port()), str(WORKER)], cwd=REPO, env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == ranks
