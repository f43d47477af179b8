"""Run by test_loading_rank0.py under `accelerate launch` (2 CPU ranks): load a checkpoint with
train.model.load_on_rank0 and write this rank's peak-RSS numbers and a weight checksum as JSON."""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import AutoConfig

from train.metrics import peak_rss_mib
from train.model import load_on_rank0


def main() -> None:
    checkpoint, out_dir = sys.argv[1], Path(sys.argv[2])
    accelerator = Accelerator(cpu=True)
    config = AutoConfig.from_pretrained(checkpoint)
    accelerator.wait_for_everyone()
    baseline = peak_rss_mib()
    model, at_broadcast = load_on_rank0(checkpoint, config, accelerator, {"dtype": torch.float32})
    checksum = sum(float(t.double().sum()) for t in model.state_dict().values())
    result = {"baseline_mib": baseline, "at_broadcast_mib": at_broadcast, "after_mib": peak_rss_mib(),
              "checksum": checksum}
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
