"""Run by test_loading_rank0.py under `accelerate launch` (2 CPU ranks): load a checkpoint the way
training does and write this rank's peak-RSS numbers and a weight checksum as JSON.

Mode "ddp": train.engine.model.load_on_rank0 (the DDP path). Mode "fsdp2": the CPU training path —
train.engine.sharding.build_accelerator (FSDP2 over gloo), train.engine.model.load_for_fsdp, then Accelerate's
prepare, which shards and fills every rank's shard from rank 0 (cpu_ram_efficient_loading)."""

import ctypes
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType
from transformers import AutoConfig

from train.observe.metrics import peak_rss_mib
from train.engine.model import load_for_fsdp, load_on_rank0
from train.engine.sharding import build_accelerator


def _sharded_checksum(model: torch.nn.Module, rank: int) -> float:
    """Σ of the whole model's weights: each rank's local shards, replicated tensors counted once."""
    total = torch.zeros((), dtype=torch.float64)
    for tensor in model.state_dict().values():
        if hasattr(tensor, "to_local"):
            total += tensor.to_local().double().sum()
        elif rank == 0:
            total += tensor.double().sum()
    dist.all_reduce(total)
    return float(total)


def rss_mib() -> float:
    """Resident set size now (VmRSS), not the peak, after glibc returns freed heap pages to the OS."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    mode, checkpoint, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    accelerator = Accelerator(cpu=True) if mode == "ddp" else build_accelerator("fp32")
    config = AutoConfig.from_pretrained(checkpoint)
    accelerator.wait_for_everyone()
    baseline, baseline_now = peak_rss_mib(), rss_mib()
    if mode == "ddp":
        model, at_broadcast = load_on_rank0(checkpoint, config, accelerator, {"dtype": torch.float32})
        checksum = sum(float(t.double().sum()) for t in model.state_dict().values())
    else:
        assert accelerator.distributed_type == DistributedType.FSDP, accelerator.distributed_type
        model = load_for_fsdp(checkpoint, config, accelerator, {"dtype": torch.float32})
        at_broadcast = peak_rss_mib()
        # FSDP2 in Accelerate prepares the model with its optimizer (SGD: no state to allocate).
        model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
        checksum = _sharded_checksum(model, accelerator.process_index)
    result = {"baseline_mib": baseline, "at_broadcast_mib": at_broadcast, "after_mib": peak_rss_mib(),
              "checksum": checksum, "rss_now_mib": rss_mib(), "baseline_now_mib": baseline_now}
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
