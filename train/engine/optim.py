"""Optimizer and learning-rate schedule.

AdamW, fused where the installed torch supports it for the parameters' device (CUDA, and CPU in
recent torch), else the foreach implementation. Weight decay skips biases and norm weights (1-D
tensors), as is usual for transformers. The schedule is a LambdaLR: linear warmup from 0 to the
peak, then cosine / linear decay to ``min_lr_ratio * peak`` at the last step (or constant).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch
from accelerate.utils import DistributedType
from torch.distributed.tensor import DTensor

from contract.config import TrainConfig
from train.engine import qlora, sharded_init
from train.kernels import float8

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger(__name__)


def prepare_for_training(accelerator: Accelerator, model: torch.nn.Module, cfg: TrainConfig,
                         total_steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Optimizer and schedule around `model`, prepared as training and the checkpoint export both need
    them (load_state restores exactly these objects). Returns (model, optimizer, scheduler)."""
    quantized = 0
    if cfg.model.init == "sharded":  # a meta model, its random weights drawn where they live
        model, optimizer = sharded_init.prepare(accelerator, model, cfg, lambda m: build_optimizer(m, cfg))
    else:
        optimizer = build_optimizer(model, cfg)
        quantized = qlora.before_prepare(accelerator, model) if cfg.lora.quant != "none" else 0
        model, optimizer = accelerator.prepare(model, optimizer)
        if float8.all_gathers_in_float8(model):
            # Accelerate maps the optimizer to the sharded parameters by data pointer, which torchao's
            # float8 weight wrapper reports as 0 (train/kernels/float8.py): rebuild the groups instead.
            sharded_init.regroup(optimizer, build_optimizer(model, cfg))
    if quantized:
        qlora.check_quantized(model, quantized)
        qlora.keep_built_weights_on_load(model)
    # On the prepared optimizer: DeepSpeed regroups the parameters (and with optimizer offload
    # Accelerate swaps in DeepSpeedCPUAdam), so the schedule must drive the groups that really step.
    # Not prepare()d itself: AcceleratedScheduler would step it once per process.
    scheduler = build_scheduler(optimizer, cfg, total_steps)
    accelerator.register_for_checkpointing(scheduler)
    return model, optimizer, scheduler


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            # ZeRO-3 partitions parameters at construction (an empty 1-D tensor here): its ds_shape is the real one.
            ndim = len(getattr(param, "ds_shape", param.shape))
            (decay if ndim >= 2 else no_decay).append(param)
    groups = [  # no empty group (LoRA has no 1-D trainable tensors): DeepSpeed drops those
        {"params": params, "weight_decay": wd}
        for params, wd in ((decay, cfg.train.weight_decay), (no_decay, 0.0)) if params
    ]
    kwargs = dict(lr=cfg.train.learning_rate, betas=(cfg.train.adam_beta1, cfg.train.adam_beta2))
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError) as err:  # e.g. a device/dtype the fused kernel lacks
        logger.info("fused AdamW unavailable (%s); using foreach", err)
        return torch.optim.AdamW(groups, foreach=True, **kwargs)


def clip_and_step(accelerator: Accelerator, optimizer: torch.optim.Optimizer, parameters: list[torch.nn.Parameter],
                  max_norm: float) -> Any:
    """Clip the gradients' total norm to `max_norm`, step the optimizer, return the norm (before clipping).

    A fused AdamW divides every gradient by the optimizer's `grad_scale` inside its own kernel (the
    attribute torch.amp.GradScaler sets for the same purpose), so the clip costs no pass of its own over
    the gradients: max(1, norm / max_norm) there is clip_grad_norm_'s multiply by min(1, max_norm / norm).
    In the 8B profile on 4 x H100 the optimizer's kernels took 57-59 ms a step against 59-62 ms (the
    fused step itself grows: it writes the divided gradients back). Elsewhere (DeepSpeed, FSDP1, the
    foreach AdamW, fp16's scaler) Accelerate clips as before."""
    inner = getattr(optimizer, "optimizer", optimizer)  # under AcceleratedOptimizer
    grads = [p.grad for p in parameters if p.grad is not None]
    if not _clips_inside_step(accelerator, inner, grads):
        norm = accelerator.clip_grad_norm_(parameters, max_norm)
        optimizer.step()
        return norm
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: each rank holds a shard's part
    if not math.isinf(max_norm):  # no clip (max_grad_norm = 0): the plain step, no division written back
        inner.grad_scale = torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
    try:
        optimizer.step()
    finally:
        inner.grad_scale = None  # nothing else that steps this optimizer (a resume's state-creating step) sees it
    return norm


def _clips_inside_step(accelerator: Accelerator, inner: torch.optim.Optimizer, grads: list[torch.Tensor]) -> bool:
    """Whether the fused AdamW may clip: every gradient whole on this rank (one GPU, DDP) or all
    DTensors (FSDP2), so their norm is the global one; no fp16 loss scaler, which owns grad_scale."""
    if not (isinstance(inner, torch.optim.AdamW) and inner.defaults.get("fused")) or not grads:
        return False
    if accelerator.scaler is not None or accelerator.distributed_type == DistributedType.DEEPSPEED:
        return False
    sharded = [isinstance(g, DTensor) for g in grads]
    if accelerator.distributed_type == DistributedType.FSDP:
        return all(sharded) and accelerator.is_fsdp2
    return not any(sharded)


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, kind: str, min_ratio: float) -> float:
    """Factor applied to the peak LR for optimizer step `step` (0-based: the LR used by step+1)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:  # linear
        shape = 1.0 - progress
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = math.ceil(cfg.train.warmup_ratio * total_steps)
    kind, min_ratio = cfg.train.lr_scheduler_type, cfg.train.min_lr_ratio
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, warmup, kind, min_ratio)
    )


def defers_gradient_sync(accelerator: Accelerator, last_micro_batch: bool) -> bool:
    """Whether this micro-batch's backward skips the cross-rank gradient reduction (`no_sync`) and leaves
    it to the step's last micro-batch.

    Never under FSDP (1 or 2): there `no_sync` keeps every parameter's *unsharded* gradient on every rank
    until the last micro-batch, the whole model's gradients on each GPU (bf16: 16 GB for 8B, 140 GB for
    70B), while the memory planner (launcher/plan/peak.py `_phases`) counts only the sharded gradients
    between micro-batches. So every backward reduce-scatters, as torchtitan does, and the shards accumulate.
    DDP and a single process hold the full gradients anyway: skipping their all-reduce costs no memory.
    DeepSpeed as before (Accelerate's `no_sync` is a no-op from ZeRO-2; `backward` sets the boundary)."""
    return not last_micro_batch and accelerator.distributed_type != DistributedType.FSDP


def backward(accelerator: Accelerator, loss: torch.Tensor, last_micro_batch: bool) -> None:
    """Backward of one micro-batch. DeepSpeed steps its optimizer inside backward whenever Accelerate
    says the gradients sync (always, outside `accumulate()`), and divides the loss by its
    gradient_accumulation_steps: here only the last micro-batch of a step is a boundary, and the loss
    is already normalised over the whole step (train/engine/loop.py's docstring), so DeepSpeed must not scale it."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        accelerator.backward(loss)
        return
    accelerator.gradient_state._set_sync_gradients(last_micro_batch)
    try:
        accelerator.backward(loss, scale_wrt_gas=False)
    finally:
        accelerator.gradient_state._set_sync_gradients(True)


def norm_tensor(norm: Any, device: torch.device) -> torch.Tensor:
    """clip_grad_norm_ returns a tensor (DDP), a DTensor (FSDP2), a float or None (DeepSpeed: its engine
    clipped inside backward; None when it has no norm to report). With CPU offload the gradients, and
    so the norm, live on the CPU: it joins the step's other numbers on the training device."""
    if norm is None:
        return torch.tensor(float("nan"), device=device)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach().reshape(()).to(device) if torch.is_tensor(norm) else torch.tensor(float(norm), device=device)


def materialize_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors (Adam's moments) without changing a weight.

    Accelerate loads an FSDP1 optimizer by reading the checkpoint into ``optimizer.state_dict()`` as a
    template: a fresh Adam has no moments yet, so none were read and the resumed run silently started
    with zero moments (H100, bench/gpu_strategies.py: FSDP1 diverged at the first step after resume).
    One step on zero gradients at learning rate 0 creates them (AdamW's decay is lr x wd = 0 too);
    the load then overwrites every value, the step count included. FSDP2 and DeepSpeed do this inside
    their own loaders."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    for param in params:
        param.grad = torch.zeros_like(param)
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)
