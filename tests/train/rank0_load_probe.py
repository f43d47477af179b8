"""Run by test_loading_rank0.py under `accelerate launch` (2 CPU ranks): load a checkpoint the way
training does and write this rank's peak-RSS numbers as JSON and the weights it holds (DDP: every
tensor; FSDP2: its local shard of each) as safetensors, for the test to compare with the file.

Mode "ddp": train.engine.model.load_on_rank0 (the DDP path). Mode "fsdp2": the CPU training path —
train.engine.sharding.build_accelerator (FSDP2 over gloo), train.engine.model.load_for_fsdp, then Accelerate's
prepare, which shards and fills every rank's shard from rank 0 (cpu_ram_efficient_loading)."""

import ctypes
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from accelerate import Accelerator
from accelerate.utils import DistributedType
from transformers import AutoConfig

from train.observe.metrics import peak_rss_mib
from train.engine.model import load_for_fsdp, load_on_rank0
from train.engine.sharding import build_accelerator


def held_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What this rank holds of each weight: the local shard of a sharded (DTensor) one, else the tensor."""
    return {name: (t.to_local() if hasattr(t, "to_local") else t).detach().contiguous().clone()
            for name, t in model.state_dict().items()}


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
    else:
        assert accelerator.distributed_type == DistributedType.FSDP, accelerator.distributed_type
        model = load_for_fsdp(checkpoint, config, accelerator, {"dtype": torch.float32})
        at_broadcast = peak_rss_mib()
        # FSDP2 in Accelerate prepares the model with its optimizer (SGD: no state to allocate).
        model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
    result = {"baseline_mib": baseline, "at_broadcast_mib": at_broadcast, "after_mib": peak_rss_mib(),
              "rss_now_mib": rss_mib(), "baseline_now_mib": baseline_now, "world": accelerator.num_processes}
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    save_file(held_tensors(model), str(out_dir / f"rank{accelerator.process_index}.safetensors"))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
