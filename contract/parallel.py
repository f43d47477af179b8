"""Whether parallel.context and parallel.expert can split the ranks and the model: one rule each, asked by the
launcher (options, planner) before the queue and by the training side before it splits.
"""

from __future__ import annotations


def context_blocker(context: int, world: int, heads: int | None, kv_heads: int | None) -> str | None:
    """Why parallel.context = `context` cannot split `world` ranks and a model of these heads (None: it can).
    Ulysses sends each rank a group of whole heads (train/kernels/context_parallel.py)."""
    if context <= 1:
        return None
    if world % context:
        return f"{context} does not divide the {world} ranks"
    if heads and heads % context:
        return f"{context} does not divide the model's {heads} attention heads (each rank attends for a group of them)"
    if kv_heads and kv_heads % context and context % kv_heads:
        return f"{context} and the model's {kv_heads} key/value heads: neither divides the other"
    return None


# The model types whose MoE blocks train/moe/expert_parallel.py computes as transformers does.
EXPERT_PARALLEL_FAMILIES = ("qwen3_moe",)


def expert_blocker(expert: int, world: int, experts: int | None, model_type: str | None = None) -> str | None:
    """Why parallel.expert = `expert` cannot split `world` ranks and a model of `experts` experts per MoE
    layer (None: it can; `experts` None: a dense model; `model_type` None: not known here). Each rank computes
    experts / `expert` whole experts, from FSDP2's shards of the fused expert tensors over every rank
    (train/moe/expert_parallel.py)."""
    if expert <= 1:
        return None
    if not experts:
        return "the model has no mixture-of-experts layers"
    if model_type and model_type not in EXPERT_PARALLEL_FAMILIES:
        return f"{model_type} models are not supported yet (supported: {', '.join(EXPERT_PARALLEL_FAMILIES)})"
    if experts % expert:
        return f"{expert} does not divide the model's {experts} experts"
    if world % expert:
        return f"{expert} does not divide the {world} ranks"
    return None


def expert_sharding_blocker(strategy: str, fsdp2_over_every_rank: bool, cpu_offload: bool) -> str | None:
    """Why expert parallelism cannot run under this sharding (None: it can): it needs FSDP2's shard over
    every rank (that shard of the fused expert tensors is each rank's experts) on the device."""
    if not fsdp2_over_every_rank:
        return f"needs --strategy fsdp (FSDP2 over every GPU), not {strategy}"
    if cpu_offload:
        return "not with profile.cpu_offload (the experts' shards would stay in host memory, where they cannot run)"
    return None
