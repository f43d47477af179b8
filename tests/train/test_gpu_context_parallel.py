"""Context parallelism with the real kernels (fa4, varlen, flash_attn) on 2 GPUs over NCCL, in bf16: the
Ulysses forward/backward equals one rank's on a packed batch whose documents cross the rank boundary
(tests/train/workers/context_parallel.py, as test_context_parallel runs it on CPU). Skipped without 2 GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.protocol import free_port
from tests.train.run_helpers import REPO, launch_env

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (none on CI)")
WORKER = Path(__file__).parent / "workers" / "context_parallel.py"


@pytest.mark.parametrize("backend", ["fa4", "varlen", "flash_attn"])
def test_ulysses_with_real_kernels_equals_one_rank(backend):
    from train.kernels.attention import PACKED_BACKENDS

    if (reason := PACKED_BACKENDS[backend][2](torch.device("cuda"))) is not None:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(WORKER), backend], cwd=REPO, env=launch_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 4  # 2 ranks x 2 loss paths
