"""``model.init = "sharded"``: a random init that no rank holds whole (a llama-70b shape on 4 GPUs: the
whole model in bf16 is 140 GB, on the CPU of every rank with ``model.init = "full"``).

Every rank builds the model on the meta device (parameters only: the RoPE ``inv_freq`` buffers stay
real, as in train/engine/qlora.py) and LoRA wraps it there. Under FSDP2, Accelerate's ``prepare``
shards the meta model (its rank-0 broadcast, ``cpu_ram_efficient_loading``, is switched off: there is
nothing to send), then each rank allocates its local shards on its device (``to_empty``, which keeps
the Parameter objects) and fills them. Without sharding (one process, DDP) the whole model is
allocated on the device and filled before ``prepare``. With FSDP2's CPU offload the shards are allocated
in host memory (drawn on the device all the same). DeepSpeed and FSDP1 are refused (one line).

The values depend on (train.seed, parameter name) only: each parameter's FULL tensor is drawn on the
device from a generator seeded by a hash of both, and the rank copies out its own rows (FSDP2 cuts
dim 0 as ``torch.chunk`` does: the last ranks may hold fewer rows, or none). So every world size
starts from the same weights, and no rank holds more than one full tensor at a time (the largest of
llama-70b, the embedding, is 2 GB in bf16). The names are taken without PEFT's wrapping
(``base_model.model.``, ``.base_layer``), so a LoRA run's base weights equal a full run's. Values as
HF Llama's init: norm weights 1, biases 0, other weights normal(0, initializer_range); LoRA A as PEFT
draws it (kaiming-uniform with a = sqrt(5): uniform(+-1/sqrt(fan_in))), LoRA B zeros.

Accelerate maps the optimizer's parameters to the sharded ones by data pointer, which is 0 for every
meta tensor; so after ``prepare`` the optimizer's groups are rebuilt from the sharded model (no step
has run: there is no optimizer state to carry over).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator, init_empty_weights
from accelerate.utils import DistributedType
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from contract.config import TrainConfig
from contract.schema import ConfigError

logger = logging.getLogger(__name__)

WRAPPING = ("base_model.model.", "_orig_mod.", "_checkpoint_wrapped_module.", "base_layer.")


def build_on_meta(config: PretrainedConfig, kwargs: dict[str, Any]) -> PreTrainedModel:
    """The model's parameters on the meta device (no memory, seconds for 70B), its buffers real."""
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    model.tie_weights()  # built on meta, the embedding and lm_head of a tied config come apart
    return model


def prepare(accelerator: Accelerator, model: torch.nn.Module, cfg: TrainConfig,
            build_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]
            ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``accelerator.prepare`` of a meta model and its optimizer, the weights drawn where they live."""
    started, device, seed = time.perf_counter(), accelerator.device, cfg.train.seed
    if not shards_on_meta(accelerator):
        materialize(model, device, device, seed, _init_range(model))
        model, optimizer = accelerator.prepare(model, build_optimizer(model))
    else:
        plugin = accelerator.state.fsdp_plugin
        plugin.cpu_ram_efficient_loading = False  # no rank has weights to broadcast
        model, optimizer = accelerator.prepare(model, build_optimizer(model))
        from torch.distributed.fsdp import CPUOffloadPolicy

        offloaded = isinstance(plugin.cpu_offload, CPUOffloadPolicy)  # FSDP2 keeps the shards in host memory
        materialize(model, torch.device("cpu") if offloaded else device, device, seed, _init_range(model))
        regroup(optimizer, build_optimizer(model))
    logger.info("rank %d: random init drawn per shard (model.init = sharded) on %s in %.1f s",
                accelerator.process_index, accelerator.device, time.perf_counter() - started)
    return model, optimizer


def shards_on_meta(accelerator: Accelerator) -> bool:
    """True under FSDP2 (shard first, then draw); False without sharding; a ConfigError where the engine
    would need the whole model on some rank first (DeepSpeed ZeRO, FSDP1)."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise ConfigError("model.init: 'sharded' needs FSDP2 (--strategy fsdp) or no sharding, not DeepSpeed",
                          "model.init")
    if accelerator.distributed_type != DistributedType.FSDP:
        return False
    if getattr(accelerator.state.fsdp_plugin, "fsdp_version", 2) != 2:
        raise ConfigError("model.init: 'sharded' needs FSDP2 (--strategy fsdp), not FSDP1", "model.init")
    return True


@torch.no_grad()
def materialize(model: torch.nn.Module, storage: torch.device, compute: torch.device, seed: int,
                init_range: float) -> None:
    """Allocate this rank's part of every meta parameter on `storage` and draw it on `compute` (module
    docstring). The buffers are real already: ``to_empty`` would replace them with uninitialised memory,
    so they are put back, on `compute`."""
    buffers = [(module, name, buffer.to(compute)) for module in model.modules()
               for name, buffer in module._buffers.items() if buffer is not None]
    shared = _shared_parameters(model)
    model.to_empty(device=storage)
    for owners in shared:  # a plain tensor leaves meta as a new Parameter per module: tie them again
        for module, name in owners[1:]:
            setattr(module, name, getattr(*owners[0]))
    for module, name, buffer in buffers:
        module._buffers[name] = buffer
    for name, param in model.named_parameters():  # each tied parameter once
        fill(param, canonical_name(name), seed, init_range, compute)


def _shared_parameters(model: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """(module, attribute) of every parameter that more than one module holds (tied weights)."""
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                owners.setdefault(id(param), []).append((module, name))
    return [places for places in owners.values() if len(places) > 1]


def fill(param: torch.Tensor, name: str, seed: int, init_range: float, compute: torch.device) -> None:
    """Write this rank's part of parameter `name` (a DTensor's local shard, or the whole tensor), the full
    tensor drawn on `compute`."""
    local = getattr(param, "_local_tensor", param)
    if (value := constant_init(name)) is not None:
        local.fill_(value)
    else:
        full = draw(tuple(param.shape), local.dtype, compute, name_seed(seed, name),
                    1 / math.sqrt(param.shape[-1]) if "lora_A" in name.split(".") else None, init_range)
        local.copy_(full[_rows(param, local)])


def constant_init(name: str) -> float | None:
    """HF Llama's init where it is a constant: norm weights 1, biases 0 (and LoRA B 0, as PEFT's); None:
    the parameter is drawn (train/engine/qlora.py's random init reads this rule too)."""
    if name.endswith("norm.weight"):
        return 1.0
    if name.endswith(".bias") or "lora_B" in name.split("."):
        return 0.0
    return None


def draw(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int, bound: float | None,
         init_range: float) -> torch.Tensor:
    """The full tensor: uniform(-bound, bound) when a bound is given, else normal(0, init_range)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    full = torch.empty(shape, dtype=dtype, device=device)
    if bound is not None:
        return full.uniform_(-bound, bound, generator=generator)
    return full.normal_(0.0, init_range, generator=generator)


def _rows(param: torch.Tensor, local: torch.Tensor) -> tuple[slice, ...]:
    """The index of this rank's part in the full tensor: FSDP2's offsets from the DTensor's placements."""
    if local is param:
        return (slice(None),)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(start, start + size) for start, size in zip(offset, local.shape))


def canonical_name(name: str) -> str:
    """The parameter's name in the plain model: without PEFT's, compile's and checkpointing's wrapping."""
    for part in WRAPPING:
        name = name.replace(part, "")
    return name


def name_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from (train.seed, name): stable across processes and Python runs."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def regroup(optimizer: torch.optim.Optimizer, fresh: torch.optim.Optimizer) -> None:
    """Point the prepared optimizer's groups at the sharded parameters (`fresh`, built on the model)."""
    groups = optimizer.param_groups
    if len(groups) != len(fresh.param_groups) or any(
            len(old["params"]) != len(new["params"]) for old, new in zip(groups, fresh.param_groups)):
        raise RuntimeError("model.init = sharded: the optimizer's groups do not match the sharded model's")
    for old, new in zip(groups, fresh.param_groups):
        old["params"] = new["params"]


def _init_range(model: torch.nn.Module) -> float:
    return float(getattr(model.config, "initializer_range", 0.02))  # a PeftModel forwards .config
