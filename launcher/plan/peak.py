"""The per-GPU peak of a training step, from launcher/plan/memory.py's and activations.py's terms. Pure Python (no torch).

Each phase of a step (forward/loss, backward/lm_head, backward/layers, backward/end, optimizer/step)
adds its tensors (saved activations, logits, the strategy's gathered weights and gradient buffers,
the optimizer's temporaries) to the persistent model state; the largest phase is the peak. The
caching allocator's reserve and the CUDA context/NCCL buffers come on top, and QLoRA on several GPUs
may peak while loading instead (`_quantized_loading`).
"""

from __future__ import annotations

from contract.shape import ModelShape
from contract.strategies import ZERO_MAX_LIVE_PARAMETERS, ZERO_SUB_GROUP_SIZE, zero_reduce_bucket_size
from launcher.plan.activations import (activation_terms, all_to_all_bytes, checkpointed_count, expert_dispatch_bytes,
                                       logits_terms)
from launcher.plan.memory import (
    ALLOCATOR_SLACK,
    CUDA_CONTEXT_BYTES,
    GIB,
    NCCL_BYTES,
    NCCL_MULTI_NODE_EXTRA_BYTES,
    MemoryBreakdown,
    MemoryOptions,
    adapter_bytes,
    ceil_div,
    dequantize_buffer,
    frozen_base_bytes,
    gathered_layer_bytes,
    low_bytes,
    shard_degree,
    state_bytes,
    trainable_params,
    trainable_tensor_sizes,
)


def _comm_terms(shape: ModelShape, opts: MemoryOptions) -> dict[str, int]:
    """Unsharded/gathered weights and gradient buffers alive in each phase (bytes per GPU).

    FSDP2/FSDP1: the current layer's all-gathered bf16 weights plus the prefetched next layer (2 x
    layer), plus the unsharded bf16 gradient of the layer being reduce-scattered; lm_head (the tail
    unit, or the FSDP1 root flat param, which also holds an untied embedding) stays unsharded from the
    loss into backward. ZeRO-3 gathers like FSDP and reduces through two `reduce_bucket_size` buffers
    (Accelerate's "auto" = hidden^2); ZeRO-2 holds full bf16 params already, so only gradient buckets.
    DDP (autocast): bf16 casts of every matmul weight are saved for backward; multi-GPU DDP also keeps a
    gradient bucket copy (gradient_as_bucket_view=False).
    """
    low = low_bytes(opts)
    d, spec = shape.hidden, opts.spec
    layer = gathered_layer_bytes(shape, opts, low)
    layer_grad = (adapter_bytes(opts, low) * shape.lora_params(opts.lora_r, opts.lora_target_modules) // shape.layers
                  if opts.lora else low * shape.gathered_layer_params(opts.expert_parallel))
    lm_head = low * shape.vocab * d
    lm_grad = 0 if opts.lora else lm_head
    if spec.engine == "fsdp":
        fsdp1 = spec.fsdp_version == 1
        root = lm_head * (2 if (fsdp1 and not shape.tied) else 1)
        dequantized = dequantize_buffer(shape, opts, low)
        layers_bwd = 2 * layer + layer_grad + (root if fsdp1 else 0) + dequantized
        return {"forward": root + (layer if not fsdp1 else 0) + dequantized, "head_backward": root + lm_grad,
                "layers_backward": layers_bwd}
    buckets = 2 * low * zero_reduce_bucket_size(d)
    if spec.zero_stage == 3:
        # Gathered weights stay resident until stage3_max_live_parameters of them are (a whole small
        # model: +0.27 GiB at 136M with offload on an H100; ~1.9 GiB at that cap for a 70B). One
        # unsharded GPU partition is the full weight already: nothing is gathered (measured too).
        gathers = opts.cpu_offload or shard_degree(opts) > 1
        adapters = adapter_bytes(opts, low) * trainable_params(shape, opts) if opts.lora else 0
        live = low * min(ZERO_MAX_LIVE_PARAMETERS, shape.total_params) + adapters if gathers else 0
        return {"forward": max(lm_head + layer, live), "head_backward": max(lm_head, live) + lm_grad + buckets,
                "layers_backward": max(2 * layer, live) + layer_grad + buckets}
    if spec.zero_stage == 2:
        return {"forward": 0, "head_backward": lm_grad + buckets, "layers_backward": layer_grad + buckets}
    cast_cache = 0 if low == 4 else low * shape.all_matmul_params
    ddp_bucket = 4 * shape.total_params if (opts.world_size > 1 and not opts.lora) else 0
    return {"forward": cast_cache, "head_backward": cast_cache + ddp_bucket,
            "layers_backward": cast_cache + ddp_bucket}


def offload_held_gradients(shape: ModelShape, opts: MemoryOptions) -> int:
    """ZeRO-2 with the optimizer on the CPU and gradient accumulation keeps the larger gradients on the GPU
    through a backward that ends no accumulation step (DeepSpeed 0.19, runtime/zero/stage_1_and_2.py).

    `reduce_independent_p_g_buckets_and_remove_grads` copies a gradient of at most `reduce_bucket_size`
    elements into one of two bucket buffers and points `param.grad` there, but a larger one bypasses them
    (`extra_large_param_to_reduce`) and keeps its own tensor. After the reduction,
    `copy_grads_in_partition` hands this rank's gradients to `async_accumulate_grad_in_cpu_via_gpu`,
    which adds them to the host copy and leaves `param.grad` set: only the backward's epilogue
    (`_clear_param_grad_only`) drops them (on the boundary micro-step
    `async_inplace_copy_grad_to_fp32_buffer_from_gpu` frees each right away; gradients outside the
    partition are freed after their reduction). So at the end of such a backward every oversized
    gradient of the partition is allocated: low-precision bytes of 1/P of them. ZeRO-3 moves each
    reduced partition into its flat buffer (on the CPU) and frees the gradient: nothing is held."""
    spec = opts.spec
    if not (spec.engine == "deepspeed" and spec.zero_stage == 2 and opts.cpu_offload
            and opts.gradient_accumulation_steps > 1):
        return 0
    bucket = zero_reduce_bucket_size(shape.hidden)
    oversized = sum(n for n in trainable_tensor_sizes(shape, opts) if n > bucket)
    return ceil_div(low_bytes(opts) * oversized, shard_degree(opts))


def _step_temporaries(shape: ModelShape, opts: MemoryOptions) -> int:
    """torch's foreach AdamW (`_multi_tensor_adam`, what `torch.optim.AdamW()` picks on CUDA, DTensor
    params included) allocates one fp32 `sqrt(v)` per parameter; the fused kernel (train/engine/optim.py)
    allocates none, and an offloaded optimizer steps on the host. DeepSpeed's step first copies the
    low-precision gradient partition into an fp32 `.grad` of its master partition (one sub-group at a
    time), which its fused Adam then reads: 4 B per trainable element of the partition."""
    if opts.cpu_offload:
        return 0
    partition = ceil_div(trainable_params(shape, opts), shard_degree(opts))
    if opts.spec.engine == "deepspeed":
        return 4 * min(partition, ZERO_SUB_GROUP_SIZE)
    return 4 * partition if opts.adamw_impl == "foreach" else 0


def _phases(shape: ModelShape, opts: MemoryOptions, full_grads: int) -> dict[str, dict[str, int]]:
    """The per-GPU tensors besides params/master/moments alive at each candidate peak of a step.

    Gradients: `zero_grad(set_to_none=True)` (train/engine/loop.py) frees them after every optimizer step, so
    with one micro-batch per step they are only allocated as backward reduces each layer: none before
    the first decoder layer's backward, all of them at the end of backward and in the step. DeepSpeed
    keeps its gradient partitions allocated for the whole run; accumulation keeps them between
    micro-batches. Phases: forward/loss (all activations saved + logits), backward/lm_head (logits
    gradients), backward/layers (top layer: recomputed layer + workspace + gathered buffers),
    backward/end (first layer, every gradient reduced) and optimizer/step.
    """
    elem = low_bytes(opts)
    act = activation_terms(shape, opts, elem)
    logits = logits_terms(shape, opts, elem)
    comm = _comm_terms(shape, opts)
    # context and expert parallelism's all-to-alls: in every layer's forward and recompute
    exchange = all_to_all_bytes(shape, opts, elem) + expert_dispatch_bytes(shape, opts, elem)
    comm |= {"forward": comm["forward"] + exchange, "layers_backward": comm["layers_backward"] + exchange}
    persistent = opts.spec.engine == "deepspeed" or opts.gradient_accumulation_steps > 1
    early_grads = full_grads if persistent else 0
    terms = ("activations", "logits_loss", "comm_buffers", "optimizer_temporaries", "gradients")
    rows = {
        "forward/loss": (act["saved"], logits["forward"], comm["forward"], 0, early_grads),
        "backward/lm_head": (act["saved"], logits["head_backward"], comm["head_backward"], 0, early_grads),
        "backward/layers": (act["saved"] + act["recompute"] + act["workspace"], logits["held"],
                            comm["layers_backward"], 0, early_grads),
        "backward/end": (act["last_layer"], logits["held"], comm["layers_backward"], 0,
                         full_grads + offload_held_gradients(shape, opts)),
        "optimizer/step": (0, logits["held"], 0, _step_temporaries(shape, opts), full_grads),
    }
    return {phase: dict(zip(terms, values)) for phase, values in rows.items()}


def _cached_not_reused(phases: dict[str, dict[str, int]], state: dict[str, int], peak: dict[str, int],
                       opts: MemoryOptions) -> int:
    """Bytes `max_memory_reserved` holds beyond the peak allocation.

    torch optimizers create AdamW's moments lazily, in the first `step()`: they, the step's
    temporaries and the gradients are carved out of the cached segments that the first forward/backward
    just freed (logits, activations, gathered weights). From the second step on those segments are
    split and occupied, so the forward/backward working set gets segments of its own: the pool holds
    params + the largest forward/backward working set + the optimizer's working set (moments, gradients,
    temporaries) side by side. DeepSpeed allocates its optimizer state when the engine is built (before
    any activation exists), so only the generic `ALLOCATOR_SLACK` applies; it is also the floor.
    The floor is a fraction of what is allocated and freed every step in many sizes (activations,
    logits, gathered weights, temporaries): rounding and split blocks come from that churn. The
    parameters, master weights and moments are allocated once and never freed, and the gradients are
    one flat buffer per layer (FSDP's reduce-scatter output, DeepSpeed's partitions) of the same sizes
    every step, so they leave nothing behind; a floor on them (64 GiB of 70B state on 16 GPUs) would
    add GiBs of imaginary slack.
    """
    churn = sum(value for term, value in peak.items() if term != "gradients")
    floor = int(ALLOCATOR_SLACK * churn)
    if opts.spec.engine == "deepspeed":
        return floor
    working = max(t["activations"] + t["logits_loss"] + t["comm_buffers"]
                  for name, t in phases.items() if name != "optimizer/step")
    step = phases["optimizer/step"]
    optimizer = state["optimizer_states"] + step["gradients"] + step["optimizer_temporaries"]
    pool = state["parameters"] + state["master_weights"] + working + optimizer
    allocated = sum(state.values()) - state["gradients"] + sum(peak.values())
    return max(floor, pool - allocated)


def gpu_memory(shape: ModelShape, opts: MemoryOptions) -> MemoryBreakdown:
    """Peak per-GPU memory = params, master weights and moments (allocated for the whole run) + the
    largest of the phases of `_phases`; reserved adds `_cached_not_reused`, total the CUDA context."""
    described = state_bytes(shape, opts)
    state = {name: value for name, (value, _) in described.items()}
    phases = _phases(shape, opts, full_grads=state["gradients"])
    phase, peak = max(phases.items(), key=lambda kv: sum(kv[1].values()))
    context = CUDA_CONTEXT_BYTES if opts.device == "gpu" else 0
    if opts.world_size > 1 and opts.device == "gpu":
        context += NCCL_BYTES + (NCCL_MULTI_NODE_EXTRA_BYTES if opts.nodes > 1 else 0)
    breakdown = MemoryBreakdown(
        **(state | peak), allocator_slack=0, cuda_context_nccl=context, peak_phase=phase,
        notes={name: note for name, (_, note) in described.items()},
    )
    breakdown.allocator_slack = _cached_not_reused(phases, state, peak, opts)
    checkpointed = checkpointed_count(shape, opts)
    ckpt = "no checkpointing" if not checkpointed else "per-layer checkpointing" + (
        f" of {checkpointed} layers" if checkpointed < shape.layers else "")
    ckpt += " keeping attention outputs" if opts.gradient_checkpointing and not opts.recompute_attention else ""
    kernels = "".join(text for on, text in ((opts.compile, ", compiled"), (opts.fused_mlp, ", fused MLP")) if on)
    loss = "full logits" if opts.loss_chunk_tokens == 0 else (
        "fused CE" if opts.loss_backend == "fused" else "chunked CE")
    breakdown.notes |= {
        "activations": f"{opts.sequence_tokens} tok, {ckpt}{kernels}"
                       + (f" (1/{opts.context_parallel} of {opts.micro_batch_tokens})" if opts.context_parallel > 1 else ""),
        "logits_loss": loss,
        "comm_buffers": f"{opts.strategy} gather/reduce buffers"
                        + (" + context-parallel all-to-all" if opts.context_parallel > 1 else ""),
        "optimizer_temporaries": f"{opts.adamw_impl} AdamW" + (" sqrt(v)" if opts.adamw_impl == "foreach" else ""),
        "allocator_slack": "cached, not reused (reserved - allocated)",
        "cuda_context_nccl": "outside torch's allocator",
    }
    if peak["gradients"] < state["gradients"]:
        breakdown.notes["gradients"] = f"not yet allocated in {phase} (state: {state['gradients'] / GIB:.2f} GiB)"
    elif peak["gradients"] > state["gradients"]:
        breakdown.notes["gradients"] = f"{low_bytes(opts)}B grads over reduce_bucket_size, held to the end of backward"
    loading = _quantized_loading(shape, opts, context)
    return loading if loading is not None and loading.total > breakdown.total else breakdown


def _quantized_loading(shape: ModelShape, opts: MemoryOptions, context: int) -> MemoryBreakdown | None:
    """QLoRA on several GPUs: every GPU holds the whole NF4 model and the fp32 adapters (train/engine/qlora.py),
    and Accelerate's prepare keeps that unsharded state dict alive until the last unit is sharded, so
    the shards come on top (llama-70b on 2 H100s: 52.0 GiB measured, BENCHMARKS.md). The slack is the
    bf16 module being quantized and to_nf4's temporaries."""
    if opts.quant == "none" or opts.world_size == 1:
        return None
    low = low_bytes(opts)
    whole = frozen_base_bytes(shape, opts, low) + 4 * trainable_params(shape, opts)
    return MemoryBreakdown(whole + ceil_div(whole, shard_degree(opts)), 0, 0, 0, 0, 0, 0, 0,
                           allocator_slack=2 * dequantize_buffer(shape, opts, low), cuda_context_nccl=context,
                           peak_phase="load/shard", notes={"parameters": "whole NF4 model + adapters, and its shards"})
