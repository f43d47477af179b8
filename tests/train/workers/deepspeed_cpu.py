"""Worker for test_deepspeed_cpu: one training process of a rendered run directory under DeepSpeed
(its CPU accelerator, gloo), built the way `accelerate launch` with the rendered accelerate.yaml builds
it (a DeepSpeedPlugin from deepspeed.json), then the real train.engine.loop.train. Usage: RUN_DIR PORT."""
import os
import sys

run_dir, port = sys.argv[1], sys.argv[2]
os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port, ACCELERATE_USE_DEEPSPEED="true")
import json
from pathlib import Path

from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin

from contract.config import load_train_config
from train.engine.loop import train
from train.main import _configure_logging

_configure_logging(Path.cwd(), attempt=None)  # no --attempt: output stays on the console
stage = json.loads(Path(run_dir, "deepspeed.json").read_text())["zero_optimization"]["stage"]
plugin = DeepSpeedPlugin(hf_ds_config=f"{run_dir}/deepspeed.json", zero3_init_flag=stage == 3)
accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision="bf16")
sys.exit(train(load_train_config(f"{run_dir}/train.toml"), accelerator))
