"""Worker for test_sharded_init: one rank started by `accelerate launch --config_file RUN/accelerate.yaml`
(FSDP2 over gloo with 2 processes; 1 process: no sharding). It builds and prepares the model as training
does (model.init = "sharded": meta model, weights drawn per shard), then rank 0 writes the gathered full
state dict with every buffer to RUN/initial.safetensors and facts about the prepared optimizer and
model to RUN/initial.json. Usage: RUN_DIR"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from contract.config import load_train_config
from train.engine.model import build_model
from train.engine.optim import prepare_for_training
from train.engine.sharding import build_accelerator, release_process_group
from train.main import _configure_logging

run_dir = Path(sys.argv[1])
_configure_logging(Path.cwd(), attempt=None)  # no --attempt: output stays on the console
cfg = load_train_config(run_dir / "train.toml")
accelerator = build_accelerator(cfg.model.precision)
model, optimizer, _ = prepare_for_training(accelerator, build_model(cfg, accelerator, "sdpa"), cfg, total_steps=1)
trainable = [p for p in model.parameters() if p.requires_grad]
in_optimizer = [p for group in optimizer.param_groups for p in group["params"]]
inner = accelerator.unwrap_model(model).get_base_model()
facts = {
    "distributed_type": str(accelerator.distributed_type), "world": accelerator.num_processes,
    "optimizer_holds_the_trainable_parameters": sorted(map(id, in_optimizer)) == sorted(map(id, trainable)),
    "tied": inner.lm_head.weight is inner.model.embed_tokens.weight,
    "meta_left": [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta],
}
state = accelerator.get_state_dict(model)  # the full state (FSDP2: gathered), on rank 0
buffers = {f"buffer:{name}": buffer.detach().cpu() for name, buffer in model.named_buffers()}
if accelerator.is_main_process:
    save_file({k: v.detach().float().contiguous().clone() for k, v in {**state, **buffers}.items()},
              str(run_dir / "initial.safetensors"))
    (run_dir / "initial.json").write_text(json.dumps(facts))
sys.exit(release_process_group(accelerator, 0))  # meets the other ranks, then no gloo thread outlives the group
