"""Worker for test_fsdp2_accumulation: one rank started by `accelerate launch --config_file RUN/accelerate.yaml`
(FSDP2 over gloo, 2 processes). The real train.engine.loop.train runs; after every micro-batch's backward
(train.engine.loop.backward, which Loop.step calls) this rank records where the gradients are:
  unsharded: FSDP parameters holding an unsharded gradient, i.e. one not reduce-scattered yet (FSDP2 keeps it
             on FSDPParam.unsharded_accumulated_grad when the reduce dtype differs from the parameter's,
             else on the unsharded parameter's .grad);
  sharded:   trainable (sharded) parameters holding a gradient, i.e. one a reduce-scatter wrote.
Rank r writes them, one record per micro-batch, to RUN/gradients-rank<r>.json. Usage: RUN_DIR"""
import json
import sys
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule

import train.engine.loop
from contract.config import load_train_config
from train.engine.sharding import build_accelerator, release_process_group
from train.main import _configure_logging

run_dir = Path(sys.argv[1])
real_backward = train.engine.loop.backward
records: list[dict] = []
prepared: list[torch.nn.Module] = []  # the prepared (FSDP2) model, learnt at the first backward


def unsharded_gradients(model: torch.nn.Module) -> int:
    # One state per fully_shard call: final norm + lm_head share one (Accelerate shards them together).
    states = {id(state): state for state in (module._get_fsdp_state() for module in model.modules()
                                             if isinstance(module, FSDPModule))}
    held = 0
    for param in (param for state in states.values() for group in state._fsdp_param_groups
                  for param in group.fsdp_params):
        unsharded = getattr(param, "_unsharded_param", None)  # absent before the first all-gather
        held += param.unsharded_accumulated_grad is not None or (unsharded is not None and unsharded.grad is not None)
    return held


def recording_backward(accelerator, loss, last_micro_batch):
    real_backward(accelerator, loss, last_micro_batch)
    model = prepared[0]
    trainable = [p for p in model.parameters() if p.requires_grad]
    records.append({"last": last_micro_batch, "unsharded": unsharded_gradients(model),
                    "sharded": sum(p.grad is not None for p in trainable), "trainable": len(trainable)})


def keep_prepared(*args, **kwargs):
    model, optimizer, scheduler = prepare_for_training(*args, **kwargs)
    prepared.append(model)
    return model, optimizer, scheduler


_configure_logging(Path.cwd(), attempt=None)  # no --attempt: output stays on the console
cfg = load_train_config(run_dir / "train.toml")
accelerator = build_accelerator(cfg.model.precision)
assert accelerator.is_fsdp2 and accelerator.num_processes == 2, (accelerator.distributed_type, accelerator.num_processes)
prepare_for_training = train.engine.loop.prepare_for_training
train.engine.loop.prepare_for_training = keep_prepared
train.engine.loop.backward = recording_backward
code = train.engine.loop.train(cfg, accelerator)
(run_dir / f"gradients-rank{accelerator.process_index}.json").write_text(json.dumps(records))
sys.exit(release_process_group(accelerator, code))
