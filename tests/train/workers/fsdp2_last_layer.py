"""Worker for test_fsdp2_last_layer: one rank started by `accelerate launch --config_file RUN/accelerate.yaml`
(FSDP2 over gloo, 2 processes). The real train.engine.loop.train runs; around every micro-batch's backward
(train.engine.loop.backward, which Loop.step calls) this rank records which decoder layers hold their gathered
(unsharded) weights: a resharded layer's parameters are DTensor shards, a gathered one's plain tensors.
Rank r writes {"before": [...], "after": [...], "layers": N} per micro-batch to RUN/gathered-rank<r>.json.
Usage: RUN_DIR"""
import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

import train.engine.loop
from contract.config import load_train_config
from train.engine.sharding import build_accelerator, release_process_group
from train.kernels.perf import decoder_layers
from train.main import _configure_logging

run_dir = Path(sys.argv[1])
real_backward = train.engine.loop.backward
records: list[dict] = []
prepared: list[torch.nn.Module] = []  # the prepared (FSDP2) model


def gathered_layers() -> list[int]:
    layers = decoder_layers(prepared[0])
    return [i for i, layer in enumerate(layers) if not any(isinstance(p, DTensor) for p in layer.parameters())]


def recording_backward(accelerator, loss, last_micro_batch):
    before = gathered_layers()  # the forward and the loss are done
    real_backward(accelerator, loss, last_micro_batch)
    records.append({"before": before, "after": gathered_layers(), "layers": len(decoder_layers(prepared[0]))})


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
(run_dir / f"gathered-rank{accelerator.process_index}.json").write_text(json.dumps(records))
sys.exit(release_process_group(accelerator, code))
