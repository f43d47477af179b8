"""What the workers that watch the real training loop share: one rank started by `accelerate launch --config_file
RUN/accelerate.yaml` (FSDP2 over gloo, 2 processes) runs train.engine.loop.train on RUN/train.toml, with every
micro-batch's backward (train.engine.loop.backward, which Loop.step calls) handed to a watcher. The watcher gets
the prepared model, a callable that runs the real backward, and whether it is the step's last micro-batch; it
returns one JSON record. Rank r writes its records to RUN/<name>-rank<r>.json."""
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import train.engine.loop
from contract.config import load_train_config
from train.engine.sharding import build_accelerator, release_process_group
from train.main import _configure_logging

Watcher = Callable[[torch.nn.Module, Callable[[], None], bool], dict]


def run_watching_backward(watch: Watcher, name: str) -> None:
    run_dir = Path(sys.argv[1])
    real_backward, real_prepare = train.engine.loop.backward, train.engine.loop.prepare_for_training
    records: list[dict] = []
    prepared: list[torch.nn.Module] = []

    def watched_backward(accelerator, loss, last_micro_batch):
        records.append(watch(prepared[0], lambda: real_backward(accelerator, loss, last_micro_batch), last_micro_batch))

    def keep_prepared(*args, **kwargs):
        model, optimizer, scheduler = real_prepare(*args, **kwargs)
        prepared.append(model)
        return model, optimizer, scheduler

    _configure_logging(Path.cwd(), attempt=None)  # no --attempt: output stays on the console
    cfg = load_train_config(run_dir / "train.toml")
    accelerator = build_accelerator(cfg.model.precision)
    assert accelerator.is_fsdp2 and accelerator.num_processes == 2, (accelerator.distributed_type,
                                                                      accelerator.num_processes)
    train.engine.loop.prepare_for_training = keep_prepared
    train.engine.loop.backward = watched_backward
    code = train.engine.loop.train(cfg, accelerator)
    (run_dir / f"{name}-rank{accelerator.process_index}.json").write_text(json.dumps(records))
    sys.exit(release_process_group(accelerator, code))
