"""The planned run's checkpoints: their size, how long one takes to write, how early SLURM must signal the job
so its stop-save finishes (profile.signal_lead_s), and what train.save_steps means when a preemption cuts the job
short (the plan's `Signal` and `Preempt` lines). Pure Python, no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.protocol import periodic_save_ahead
from launcher.plan.host_memory import save_staging

# launcher.plan.planner.PlanInput: not imported, the planner imports this module (no import cycle, even type-only)
PlanInput = Any

CHECKPOINT_WRITE_SAFETY = 1.5  # shared storage is rarely at its nominal bandwidth
# The work a preemption may lose that the suggested train.save_steps aims at, and (synchronous saves) the
# share of training time the saves may pause it for; an asynchronous save pauses only to copy to CPU memory.
LOSS_TARGET_S = 600
SYNC_SAVE_SHARE = 0.05
SIGNAL_MARGIN_S = 30  # stop-flag all-reduce, rename + COMPLETE marker, process teardown
MIN_SIGNAL_LEAD_S = 60


@dataclass
class SaveCadence:
    """What train.save_steps means when the job must stop: how long a stop-save takes, how much work a
    preemption loses when SLURM kills the job before its stop-save completes (GraceTime shorter than the
    save), and the save_steps that bounds that loss to ~LOSS_TARGET_S. None where the step time is unknown."""

    write_s: float  # one checkpoint's write at the planned bandwidth (x safety)
    stop_save_s: int  # the step in progress + a write (a new one, or the one in flight to finish) + margin
    asynchronous: bool
    lost_steps: int | None  # at most: the steps since the newest COMPLETE checkpoint
    lost_s: float | None
    suggested_save_steps: int | None
    # Asynchronous saves: where they are staged and why (host_memory.save_staging); FSDP2 runs whose
    # train.async_save cannot be honoured: why their saves are synchronous (sync_save_reason).
    staging: str = ""


def checkpoint_bytes(trainable: int, inp: PlanInput) -> int:
    """Accelerate `save_state`: model state + optimizer. FSDP/DDP save the fp32 trainable params (4 B)
    and AdamW moments (8 B); DeepSpeed saves bf16 module weights (2 B) + fp32 master and moments (12 B).
    LoRA saves the adapters only (the frozen base is re-read from model.path)."""
    per_param = 14 if inp.spec.engine == "deepspeed" else 12
    return per_param * trainable


def checkpoint_write_seconds(ckpt_bytes: int, inp: PlanInput) -> float:
    """One checkpoint written at the slower of the storage and the nodes' combined client bandwidth (x safety)."""
    bandwidth = min(inp.storage_write_gbps, inp.nodes * inp.node_write_gbps) * 1e9
    return CHECKPOINT_WRITE_SAFETY * ckpt_bytes / bandwidth


def signal_lead_seconds(ckpt_bytes: int, inp: PlanInput, step_time_s: float | None) -> int:
    """How long before the time limit SLURM must signal the job: finish the current optimizer step
    (the stop flag is checked at step boundaries), write the checkpoint (or finish the asynchronous one in
    flight, which takes no longer), plus a fixed margin; >= 60 s, rounded up to 10 s."""
    seconds = checkpoint_write_seconds(ckpt_bytes, inp) + (step_time_s or 0.0) + SIGNAL_MARGIN_S
    return max(MIN_SIGNAL_LEAD_S, int(math.ceil(seconds / 10.0)) * 10)


def save_cadence(ckpt_bytes: int, inp: PlanInput, step_time_s: float | None, lead_s: int,
                 process_bytes: int = 0, total_steps: int | None = None) -> SaveCadence:
    """A preemption whose GraceTime ends before the stop-save completes resumes from the newest COMPLETE
    checkpoint: up to save_steps steps old, and with asynchronous saves up to a write longer (the save of step
    N is complete only once written, while training goes on). Synchronous saves pause training for the whole
    write, so the suggested interval also keeps their pauses under SYNC_SAVE_SHARE of the time."""
    write_s = checkpoint_write_seconds(ckpt_bytes, inp)
    why_not = sync_save_reason(inp, total_steps)
    asynchronous = inp.async_save and not why_not
    node_shards = ckpt_bytes if inp.spec.shards == "node" else ckpt_bytes // inp.nodes  # HSDP: a copy per node
    staging = save_staging(inp.async_save_staging, node_shards, process_bytes, inp.cpu_mem_per_node_gib) \
        if asynchronous else f"is written synchronously: {why_not}" if inp.async_save and inp.fsdp2 else ""
    if not step_time_s:
        return SaveCadence(write_s, lead_s, asynchronous, None if asynchronous else inp.save_steps, None, None, staging)
    lost_steps = inp.save_steps + (math.ceil(write_s / step_time_s) if asynchronous else 0)
    interval_s = max(LOSS_TARGET_S, write_s if asynchronous else write_s / SYNC_SAVE_SHARE)
    return SaveCadence(write_s, lead_s, asynchronous, lost_steps, lost_steps * step_time_s,
                       max(1, math.ceil(interval_s / step_time_s)), staging)


def sync_save_reason(inp: PlanInput, total_steps: int | None = None) -> str:
    """Why the run writes its checkpoints synchronously whatever train.async_save says ("" = it need not), as the
    run finds out itself (train/engine/checkpoint.py, loop.py): only FSDP2's sharded state of plain tensors is
    staged, and only where a periodic save falls before the last step (a stop-save is synchronous)."""
    if not inp.fsdp2:
        return f"{inp.spec.title}: only FSDP2's sharded state is written behind training"
    if total_steps is not None and not periodic_save_ahead(0, inp.save_steps, total_steps):
        return f"no periodic save before the last step ({total_steps:,}), only a stop-save"
    if inp.quant != "none":
        return "QLoRA's NF4 base weights are tensors the staging cannot copy"
    if inp.fp8_all_gather:
        return "train.fp8_all_gather's weight wrapper is a tensor the staging cannot copy"
    return ""
