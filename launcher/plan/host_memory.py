"""Host RAM per node for a planned run (the GPU side is launcher/plan/memory.py). Pure Python (no torch)."""

from __future__ import annotations

from contract.protocol import STAGING_RAM_SHARE
from contract.shape import ModelShape
from launcher.plan.activations import offloaded_activation_bytes
from launcher.plan.memory import GIB, MemoryOptions, ceil_div, low_bytes, shard_degree, trainable_params

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


def training_cpu_bytes(shape: ModelShape, opts: MemoryOptions) -> int:
    """Host RAM of a node's training processes once the model is loaded (what a save's staging competes with)."""
    ram = cpu_bytes_per_node(shape, opts)
    return ram["total"] - ram["model_loading"]


def save_staging(setting: str, shard_bytes: int, process_bytes: int, node_gib: float | None) -> str:
    """Where train.async_save stages a save, as profile.mem tells (the run decides at its first save from the RAM a
    node has available: train/engine/checkpoint.py): CPU memory when the node's `shard_bytes` (its ranks' shards)
    fit STAGING_RAM_SHARE of what its training processes (`process_bytes`) leave, else node-local disk."""
    shards = f"{shard_bytes / 1e9:,.1f} GB of shards a node"
    if setting != "auto":
        return f"staged {_where(setting == 'memory')}: train.async_save_staging = {setting}, {shards}"
    if node_gib is None:
        return (f"staged in CPU memory if a node's available RAM holds its {shards}, else on node-local disk "
                "(profile.mem does not give the node's RAM)")
    fits = shard_bytes <= STAGING_RAM_SHARE * (node_gib * GIB - process_bytes)
    return (f"staged {_where(fits)}: {shards} + {process_bytes / 1e9:,.1f} GB of training processes "
            f"{'fit' if fits else 'exceed'} mem {node_gib:,.0f} GiB")


def _where(memory: bool) -> str:
    return "in CPU memory" if memory else "on node-local disk (profile.node_local_dir)"
