"""Rank-0-only loading: rank 0 reads a ~140 MB checkpoint; rank 1 builds on the meta device, so its
peak RSS stays at its baseline until the broadcast. Both paths: DDP (load_on_rank0) and FSDP2 over
gloo, the CPU training path (load_for_fsdp + Accelerate's sharding, after which rank 1 keeps only its
shard). What each rank ends up holding is compared tensor by tensor, bit for bit, with the checkpoint
file read independently (safetensors), not with another rank's copy."""

import json
import subprocess
import sys

import pytest
import torch
from tests.train.run_helpers import REPO, launch_env, write_run

pytestmark = pytest.mark.slow

BIG_ARCH = dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256)


def _save_checkpoint(checkpoint) -> float:
    """A ~140 MB random Llama; returns its size in MiB."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**BIG_ARCH)).save_pretrained(checkpoint)
    size_mib = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors")) / 2**20
    assert 100 < size_mib < 200
    return size_mib


def _assert_holds_the_file(tmp_path, checkpoint, rank: int, world: int, sharded: bool) -> None:
    """Rank `rank`'s tensors equal the checkpoint file's (its dim-0 chunk of each where sharded)."""
    from safetensors.torch import load_file

    reference = {}
    for path in checkpoint.glob("*.safetensors"):
        reference.update(load_file(path))
    held = load_file(tmp_path / f"rank{rank}.safetensors")
    assert set(reference) <= set(held), f"rank {rank} lacks {sorted(set(reference) - set(held))[:4]}"
    for name, want in reference.items():
        if sharded and want.dim() > 0:
            want = torch.chunk(want, world)[rank] if rank < len(torch.chunk(want, world)) else want[:0]
        assert torch.equal(held[name], want), f"rank {rank}: {name} differs from the checkpoint file"


def _probe(tmp_path, mode: str, checkpoint) -> tuple[dict, dict]:
    run_dir = write_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run_dir / "accelerate.yaml"),
           str(REPO / "tests" / "train" / "rank0_load_probe.py"), mode, str(checkpoint), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tuple(json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))


def test_only_rank0_reads_the_weights(tmp_path):
    checkpoint = tmp_path / "ckpt"
    size_mib = _save_checkpoint(checkpoint)
    rank0, rank1 = _probe(tmp_path, "ddp", checkpoint)

    # Rank 1's peak RSS while rank 0 loads stays at its baseline (it holds only meta tensors) ...
    assert rank1["at_broadcast_mib"] - rank1["baseline_mib"] < 0.1 * size_mib
    # ... and both end with a resident copy (safetensors are mmapped on rank 0: pages become
    # resident as the broadcast reads them, so rank 0's growth shows after, not before, it).
    for rank in (rank0, rank1):
        assert rank["after_mib"] - rank["baseline_mib"] > 0.8 * size_mib
    for rank in (0, 1):
        _assert_holds_the_file(tmp_path, checkpoint, rank, world=2, sharded=False)


def test_fsdp2_only_rank0_reads_and_each_rank_keeps_its_shard(tmp_path):
    checkpoint = tmp_path / "ckpt"
    size_mib = _save_checkpoint(checkpoint)
    rank0, rank1 = _probe(tmp_path, "fsdp2", checkpoint)
    # Rank 1 holds nothing until rank 0 broadcasts (meta device, then untouched empty storage) ...
    assert rank1["at_broadcast_mib"] - rank1["baseline_mib"] < 0.1 * size_mib
    # ... and ends holding its shard, not a whole copy (resident now, freed heap returned: on CPU the
    # broadcast's per-tensor buffers lift the *peak* to about one copy), with rank 0's values.
    assert rank1["rss_now_mib"] - rank1["baseline_now_mib"] < 0.9 * size_mib
    assert rank0["world"] == rank1["world"] == 2
    for rank in (0, 1):
        _assert_holds_the_file(tmp_path, checkpoint, rank, world=2, sharded=True)
