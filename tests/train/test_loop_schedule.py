"""LR schedules (warmup, cosine/linear/constant, min-lr floor), the optimizer's parameter groups, the step's numbers."""

import math

import pytest
import torch

from contract.config import TrainConfig
from train.engine.optim import norm_tensor
from train.engine.optim import build_optimizer, build_scheduler, lr_multiplier


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_warmup_then_decay_to_floor(kind):
    total, warmup, floor = 100, 10, 0.1
    values = [lr_multiplier(s, total, warmup, kind, floor) for s in range(total)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    if kind == "constant":
        assert all(v == 1.0 for v in values[10:])
    else:
        assert all(a >= b for a, b in zip(values[10:], values[11:]))
        assert lr_multiplier(total, total, warmup, kind, floor) == pytest.approx(floor)
    if kind == "cosine":  # halfway through the decay: midway between peak and floor
        assert lr_multiplier(55, total, warmup, kind, floor) == pytest.approx(floor + (1 - floor) * 0.5)


def test_scheduler_drives_optimizer_lr():
    cfg = TrainConfig()
    cfg.model.arch = {"hidden_size": 4}
    cfg.train.learning_rate, cfg.train.warmup_ratio, cfg.train.weight_decay = 1e-3, 0.1, 0.01
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, cfg)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) == 1  # only the Linear weight; biases and norm weights skip decay
    scheduler = build_scheduler(optimizer, cfg, total_steps=20)
    seen = []
    for _ in range(20):
        seen.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert seen[0] == pytest.approx(1e-3 / 2)  # warmup of ceil(0.1*20) = 2 steps
    assert seen[1] == pytest.approx(1e-3)
    assert seen[-1] < seen[2] and not math.isnan(seen[-1])


def test_grad_norm_joins_the_step_numbers_on_the_training_device() -> None:
    """FSDP/ZeRO CPU offload: clip_grad_norm_ returns a CPU norm while the loss lives on the GPU
    (an H100 run crashed in torch.stack). 'meta' stands in for the GPU here."""
    meta = torch.device("meta")
    assert norm_tensor(torch.tensor(2.0), meta).device == meta
    assert norm_tensor(1.5, meta).device == meta
    assert torch.isnan(norm_tensor(None, torch.device("cpu")))
