"""QLoRA: the frozen base's linear weights in 4-bit NF4 with double quantization, LoRA adapters in
fp32, compute in the model's precision (bf16 on GPUs).

Why torchao's ``NF4Tensor`` and not bitsandbytes' ``Params4bit``: NF4Tensor is a tensor subclass
that FSDP2 knows how to shard and all-gather (``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``:
the packed 4-bit codes, the int8 block scales and the per-256-block scale factors travel, never a
bf16 copy), it survives ``fully_shard``'s DTensor conversion with its quantization state, and it is
plain torch code, so it also runs on CPU (CI trains, resumes and exports QLoRA for real). The
peers' traps are avoided by construction: ``Params4bit`` with uint8 storage loses its quant state
under FSDP2 (Accelerate has to leave such parameters unsharded) and trains silently wrong;
``check_quantized`` fails loudly if a quantized weight ever comes back as a plain tensor.

Loading (``build_quantized_model``), rank-0-only as for the other strategies: every rank builds the
model skeleton on the meta device; module by module, global rank 0 copies the bf16 tensors from its CPU copy of
the checkpoint and broadcasts them one at a time (a random init for ``model.arch`` is drawn on every
rank from the same seed instead), and every rank quantizes the targeted linear weights as they
arrive. No rank ever holds the
whole bf16 model on a GPU; until ``fully_shard`` cuts it to 1/world each GPU holds the whole model
in NF4 (~0.52 byte/parameter; the planner counts this loading peak). The modules are quantized
straight onto the GPU: fully_shard would move a CPU tensor subclass by wrapping it in a fresh
``nn.Parameter``, which requires grad (torch 2.11), and then fails to shard it. Accelerate's own rank-0 broadcast
(``cpu_ram_efficient_loading``) is turned off for such a model (``prepare_for_sharding``): the
weights are already on every rank.

The matmul (``NF4Linear``) dequantizes the weight to the input's dtype, multiplies, and in backward
dequantizes again for the input gradient (the weight gets none). On CUDA the dequantization is one
compiled elementwise kernel over the packed codes (torchao's eager path makes several int64 copies
of the whole weight per call).
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from accelerate import Accelerator, init_empty_weights
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from contract.config import TrainConfig
from contract.schema import ConfigError
from contract.shape import NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE, nf4_blocker
from train.engine.sharded_init import constant_init

logger = logging.getLogger(__name__)

BLOCK_SIZE, SCALER_BLOCK_SIZE = NF4_BLOCK_SIZE, NF4_SCALER_BLOCK_SIZE  # QLoRA's (contract.shape: the shape rule)


def nf4_api() -> tuple[type, Any]:
    """(NF4Tensor, to_nf4) from torchao; a one-line ConfigError when it is not installed."""
    try:
        from torchao.quantization import NF4Tensor, to_nf4
    except ImportError as err:
        raise ConfigError(f"lora.quant: 'nf4' needs torchao ({err}); pip install 'sft-launch[qlora]'",
                          "lora.quant") from None
    return NF4Tensor, to_nf4


def _is_target(name: str, module: torch.nn.Module, targets: set[str]) -> bool:
    return isinstance(module, torch.nn.Linear) and ".layers." in f".{name}" and name.rsplit(".", 1)[-1] in targets


def build_quantized_model(cfg: TrainConfig, config: PretrainedConfig, accelerator: Accelerator,
                          kwargs: dict[str, Any], source: PreTrainedModel | None) -> PreTrainedModel:
    """The model with NF4 target linears, on this rank's device (see the module docstring). `source`:
    rank 0's CPU copy of the pretrained model; None = random init (every rank draws the same values)."""
    _, to_nf4 = nf4_api()
    with init_empty_weights(include_buffers=False):  # parameters on meta, buffers (RoPE) real
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    device, world = accelerator.device, accelerator.num_processes
    targets, done, quantized = set(cfg.lora.target_modules), set(), 0
    source_state = source.state_dict() if source is not None else {}
    pretrained = bool(cfg.model.path)  # every rank: rank 0 has the source, the others receive from it
    for name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in done]
        if not own:
            continue
        module.to_empty(device=device, recurse=False)
        for pname, _ in own:
            param = getattr(module, pname)
            done.add(id(param))
            _fill(param.data, f"{name}.{pname}" if name else pname, source_state if pretrained else None, config,
                  accelerator)
        if _is_target(name, module, targets):
            blocker = nf4_blocker(tuple(module.weight.shape), world)
            if blocker:
                raise ConfigError(f"lora.quant: {name}.weight {blocker}; use lora.quant = \"none\"", "lora.quant")
            module.weight = torch.nn.Parameter(to_nf4(module.weight.data, BLOCK_SIZE, SCALER_BLOCK_SIZE),
                                               requires_grad=False)
            module.forward = types.MethodType(_nf4_linear_forward, module)
            quantized += 1
    for owner in model.modules():  # the buffers (RoPE); not model.to(): it would re-wrap the NF4 parameters
        for name, buffer in list(owner.named_buffers(recurse=False)):
            setattr(owner, name, buffer.to(device))
    model.tie_weights()
    logger.info("QLoRA: %d linear weights in NF4 (block %d, double-quantized scales per %d blocks) on rank %d",
                quantized, BLOCK_SIZE, SCALER_BLOCK_SIZE, accelerator.process_index)
    return model


@torch.no_grad()
def _fill(tensor: torch.Tensor, name: str, source_state: dict[str, torch.Tensor] | None, config: PretrainedConfig,
          accelerator: Accelerator) -> None:
    """A checkpoint's tensor: rank 0 copies it from its CPU model and broadcasts it. A random init:
    every rank draws the same values from the same seed (no traffic; and every rank's RNG advances
    alike, so the LoRA adapters created next start equal on every rank and at every world size)."""
    if source_state is not None:  # a checkpoint: only rank 0's dict has the tensors
        if accelerator.is_main_process:
            tensor.copy_(source_state[name])
        if accelerator.num_processes > 1:
            dist.broadcast(tensor, src=0)
    elif (value := constant_init(name)) is not None:
        tensor.fill_(value)
    else:  # HF Llama init: normal(0, initializer_range) for linears and the embedding
        tensor.normal_(0.0, getattr(config, "initializer_range", 0.02))


def dequantize(weight: Any, dtype: torch.dtype, eager: bool = False) -> torch.Tensor:
    """The NF4 weight in `dtype`; the same arithmetic as torchao's ``get_original_weight``. `eager`: the
    plain torch ops on a GPU too, not the compiled kernel."""
    args = (weight.quantized_data, weight.quantized_scalers, weight.quantization_factor, weight.scaler_mean,
            weight.nf4, weight.block_size, weight.scaler_block_size, weight.dtype)
    kernel = _compiled_dequantize() if weight.quantized_data.is_cuda and not eager else _dequantize
    return kernel(*args).view(weight.shape).to(dtype)


def _dequantize(codes: torch.Tensor, scalers: torch.Tensor, factors: torch.Tensor, mean: torch.Tensor,
                lut: torch.Tensor, block_size: int, scaler_block_size: int, dtype: torch.dtype) -> torch.Tensor:
    scales = (scalers.view(-1, scaler_block_size) / factors.unsqueeze(-1)).flatten().to(dtype) + mean
    per_byte = scales.unsqueeze(-1).expand(scales.numel(), block_size // 2).flatten()
    high = lut[(codes >> 4).to(torch.long)] * per_byte
    low = lut[(codes & 0b1111).to(torch.long)] * per_byte
    return torch.stack([high, low], dim=-1).flatten()


@functools.cache
def _compiled_dequantize() -> Any:
    return torch.compile(_dequantize, dynamic=False)


class NF4Linear(torch.autograd.Function):
    """y = x @ W^T with W in NF4: W is dequantized in forward and again in backward (never stored)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Any) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return x @ dequantize(weight, x.dtype).t()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weight,) = ctx.saved_tensors
        return grad @ dequantize(weight, grad.dtype), None


def _nf4_linear_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = NF4Linear.apply(x, self.weight)
    return out if self.bias is None else out + self.bias


def before_prepare(accelerator: Accelerator, model: torch.nn.Module) -> int:
    """Ready a QLoRA model for ``accelerator.prepare``; returns its NF4 weight count. Every rank holds
    the weights already, so Accelerate's rank-0 broadcast (which would move the model to meta and send
    plain tensors) is switched off for it."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None:
        plugin.cpu_ram_efficient_loading = False
        if accelerator.num_processes == 1:
            # FSDP2 at world size 1 copies a single all-gather input per parameter (torch 2.11-2.13),
            # while an NF4 weight has three: nothing to shard on one rank, so FSDP leaves them alone.
            nf4_tensor, _ = nf4_api()
            plugin.ignored_modules = [m for m in model.modules()
                                      if isinstance(getattr(m, "weight", None), nf4_tensor)]
    return count_quantized(model)


def local_weight(param: torch.Tensor) -> torch.Tensor:
    """The tensor behind a parameter: a DTensor's local shard under FSDP2."""
    return getattr(param, "_local_tensor", param)


def check_quantized(model: torch.nn.Module, expected: int) -> None:
    """Fail when sharding (or anything else) turned an NF4 weight back into a plain tensor: the
    peers' silent failure (Params4bit under FSDP2) becomes a one-line error here."""
    nf4_tensor, _ = nf4_api()
    weights = [p for p in model.parameters() if isinstance(local_weight(p), nf4_tensor)]
    if len(weights) != expected:
        raise RuntimeError(f"QLoRA: {len(weights)} of {expected} NF4 weights are still NF4 after sharding")
    if any(p.requires_grad for p in weights):
        raise RuntimeError("QLoRA: NF4 base weights require grad after sharding; they must stay frozen")


def keep_built_weights_on_load(model: torch.nn.Module) -> None:
    """A resume restores the adapters, the optimizer and the data position, not the NF4 base weights:
    they are frozen, and every start rebuilds them exactly (the same checkpoint quantized the same way,
    or the same seeded random draw). Copying them back is not only needless but broken on GPUs: under
    FSDP2 on 2 H100s (torch 2.11, torchao 0.18) ``load_state_dict``'s ``param.copy_`` into an NF4
    DTensor failed with "maximum recursion depth exceeded" for every base weight (bench/gpu_resume.py
    fsdp-qlora), while on CPU ranks it worked. So each module holding one drops that key before
    ``load_state_dict`` copies and takes it off the missing keys after (the checkpoint still saves it)."""
    nf4_tensor, _ = nf4_api()

    dropped: set[str] = set()

    def drop_weight(module, state_dict, prefix, *_):
        if state_dict.pop(prefix + "weight", None) is not None:
            dropped.add(prefix + "weight")

    def not_missing(module, incompatible):
        incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in dropped]

    for module in model.modules():
        if isinstance(local_weight(getattr(module, "weight", None)), nf4_tensor):
            module._register_load_state_dict_pre_hook(drop_weight, with_module=True)
            module.register_load_state_dict_post_hook(not_missing)


def count_quantized(model: torch.nn.Module) -> int:
    nf4_tensor, _ = nf4_api()
    return sum(isinstance(local_weight(p), nf4_tensor) for p in model.parameters())


def full_state_dict(accelerator: Accelerator, model: torch.nn.Module,
                    dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """``accelerator.get_state_dict`` of a QLoRA model (collective; full, on rank 0's CPU), each NF4
    weight dequantized to `dtype`; `dtype` None (an adapter-only export) leaves the frozen base out.

    Why the NF4 weights are kept out of Accelerate's gather: torchao's all-gather override answers an
    NF4 DTensor with an NF4Tensor over three all-gathers still in flight, and torch's state-dict gather
    waits only for a plain AsyncCollectiveTensor. The export then went on while gloo/NCCL still wrote
    into the state dict, and ranks other than 0 never waited at all (c10d's "unwaited collective calls"
    at exit, 3 per NF4 weight, each keeping its gathered buffers). So each NF4 weight is replaced by an
    empty stand-in for that gather and gathered afterwards, one at a time, as a plain tensor."""
    nf4_tensor, _ = nf4_api()
    held: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}  # module order: alike on every rank

    def hold_back(module, state_dict, prefix, _local_metadata):
        stand_in = torch.empty(0)
        held[module] = (stand_in, state_dict[prefix + "weight"])
        state_dict[prefix + "weight"] = stand_in

    owners = [module for module in model.modules()  # not peft's LoRA layer, whose .weight is its base's
              if isinstance(local_weight(dict(module.named_parameters(recurse=False)).get("weight")), nf4_tensor)]
    handles = [module.register_state_dict_post_hook(hold_back) for module in owners]
    try:
        state = accelerator.get_state_dict(model)
    finally:
        for handle in handles:
            handle.remove()
    key_of = {id(value): key for key, value in state.items()}  # the stand-ins' keys; empty off rank 0
    for stand_in, weight in held.values():
        full = gathered_dequantized(weight, dtype) if dtype is not None else None
        key = key_of.get(id(stand_in))
        if key is None:
            continue
        if full is None:
            del state[key]
        else:
            state[key] = full.cpu()
    return state


def gathered_dequantized(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole NF4 weight in `dtype` on every rank (collective when sharded): each rank dequantizes its
    own shard and the shards travel as a plain tensor. A shard holds whole quantization blocks
    (``quantizable``) and the arithmetic is elementwise per block, the eager one the export always used,
    so the result is bitwise the dequantized whole weight."""
    local = dequantize(local_weight(weight), dtype, eager=True)
    if not isinstance(weight, DTensor):
        return local
    return DTensor.from_local(local, weight.device_mesh, weight.placements, shape=weight.shape,
                              stride=weight.stride()).full_tensor()
