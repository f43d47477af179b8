"""The fused lm_head + loss reads lm_head.weight inside the root forward: under FSDP2 that weight
must be the unsharded one. Proven with real FSDP2 (torch fully_shard, 2 gloo ranks on CPU)."""

import subprocess
import sys
from pathlib import Path

import pytest

from contract.protocol import free_port
from tests.train.run_helpers import REPO, launch_env


@pytest.mark.slow
def test_fused_loss_gradients_exact_under_fsdp2_sharding():
    worker = Path(__file__).parent / "workers" / "fsdp2_fused_loss.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
         str(worker)], cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 12  # 2 ranks x 3 shardings x 2 loss backends
