"""Worker for test_deepspeed_cpu: one rank started by `accelerate launch --config_file RUN/accelerate.yaml`
(the file sft-launch rendered, 2 processes) on CPU. DeepSpeed runs on its CPU accelerator over gloo; the
Accelerator is built from what the launcher exported for that file (ACCELERATE_USE_DEEPSPEED, the
rendered deepspeed.json, zero3_init_flag), then the real train.engine.loop.train runs. Rank 0 also writes the
model's initial weights to RUN/initial.safetensors (gathered under ZeRO-3), so the test can tell an
export that trained from one that did not. Usage: RUN_DIR"""
import os
import sys

os.environ["DS_ACCELERATOR"] = "cpu"
from pathlib import Path

import deepspeed
import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType
from safetensors.torch import save_file

import train.engine.loop
from contract.config import load_train_config
from train.engine.sharding import release_process_group
from train.main import _configure_logging

run_dir = Path(sys.argv[1])
build_model = train.engine.loop.build_model


def build_and_keep_initial(cfg, accelerator, attn):
    model = build_model(cfg, accelerator, attn)
    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):  # a no-op unless ZeRO-3 partitioned them
        if accelerator.is_main_process:
            save_file({name: p.detach().float().clone().contiguous() for name, p in params.items()},
                      str(run_dir / "initial.safetensors"))
    return model


_configure_logging(Path.cwd(), attempt=None)  # no --attempt: output stays on the console
PartialState(backend="gloo")  # no CUDA: Accelerate picks no backend by itself (it would count 1 process)
accelerator = Accelerator()
assert accelerator.distributed_type == DistributedType.DEEPSPEED, accelerator.distributed_type
assert accelerator.num_processes == 2 and not torch.cuda.is_available(), accelerator.num_processes
train.engine.loop.build_model = build_and_keep_initial
code = train.engine.loop.train(load_train_config(run_dir / "train.toml"), accelerator)
sys.exit(release_process_group(accelerator, code))
