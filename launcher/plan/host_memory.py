"""Host RAM per node for a planned run (the GPU side is launcher/plan/memory.py). Pure Python (no torch)."""

from __future__ import annotations

from contract.shape import ModelShape
from launcher.plan.memory import (GIB, MemoryOptions, ceil_div, low_bytes, offloaded_activation_bytes, shard_degree,
                                  trainable_params)

PROCESS_CPU_BYTES = 3 * GIB  # RSS of one rank (python + torch + CUDA/NCCL libs + dataloader)
PROCESS_CPU_ONLY_BYTES = 1 * GIB  # a CPU rank (no CUDA/NCCL libs): python + torch + transformers + dataloader


def cpu_bytes_per_node(shape: ModelShape, opts: MemoryOptions) -> dict[str, int]:
    """Host RAM on the busiest node (node 0): rank processes, model loading, offloaded state.

    Loading: with Accelerate's `cpu_ram_efficient_loading` (FSDP) only rank 0 materializes the full
    weights (trainable upcast to fp32, frozen in bf16); otherwise every local rank does, and so does a
    random init without a checkpoint (model.init "full"); model.init "sharded" draws each rank's shards on
    its GPU and loads nothing on the host (train/engine/sharded_init.py). ZeRO-3 under
    `zero.Init` streams one copy; ZeRO-2/DDP load a full copy per rank. Offload keeps each local rank's
    share of the state on the host (pinned): FSDP params+grads+moments; ZeRO fp32 master + moments +
    fp32 grad partitions (+ bf16 params for ZeRO-3).
    """
    low = low_bytes(opts)
    trainable = trainable_params(shape, opts)
    frozen = shape.total_params if opts.lora else 0
    p, local = shard_degree(opts), opts.gpus_per_node
    spec = opts.spec
    if spec.engine == "fsdp":
        full = 4 * trainable + low * frozen
        rank0_only = opts.cpu_ram_efficient_loading and opts.model_source == "checkpoint"
        loading = 0 if opts.model_source == "sharded" else full if rank0_only else local * full
        offload = local * ceil_div(16 * trainable + low * frozen, p) if opts.cpu_offload else 0
    elif spec.zero_stage == 3:
        loading = low * (trainable + frozen)
        offload = local * ceil_div((16 + low) * trainable + low * frozen, p) if opts.cpu_offload else 0
    else:
        loading = local * (4 if spec.fp32_params else low) * (trainable + frozen)
        offload = local * ceil_div(16 * trainable, p) if opts.cpu_offload else 0
    offload += local * offloaded_activation_bytes(shape, opts)  # train.activation_offload, pinned
    baseline = (PROCESS_CPU_BYTES if opts.device == "gpu" else PROCESS_CPU_ONLY_BYTES) * local
    return {"process_baseline": baseline, "model_loading": loading, "offload": offload,
            "total": baseline + loading + offload}
