"""The planner's speed model: predicted step time and tokens/s of one planned run (issue #55), and from them the
job's time estimate (steps, segments, requeues, ETA, GPU-hours, cost).

Pure Python (no torch). A step is the time of its compute plus what of the rest does not hide behind it:

  compute     model FLOPs of the micro-batch (contract/shape.py's count at the mean document length, x the
              forward again with per-layer checkpointing) at an achievable fraction of the GPU's peak (LoRA's
              and FP8's factors on the linears' share only, not on attention's);
  collectives FSDP's all-gathers of the weights (forward, and again in backward: layers reshard after their
              forward) and reduce-scatters of the gradients, bytes from the shape, the strategy, LoRA's frozen
              base and NF4, over the node's links or, across nodes, the network; prefetched during the
              neighbouring layers' compute, so only what exceeds the compute (plus the first gather and the
              last reduce, which nothing hides) adds to the step;
  the rest    not overlapped: QLoRA's dequantization of each weight before its matmuls, context parallelism's
              all-to-alls (attention waits on them), activation offload's copies where they outlast the
              compute they overlap, and CPU offload's PCIe traffic and host AdamW step.

Every constant below says where its number comes from: measured (bench/results, re-derived by
bench/suites/speed_calibration.py into tests/fixtures/speed_calibration.json) or a datasheet figure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from contract import gpus
from contract.shape import ModelShape
from launcher.plan.activations import offloaded_activation_bytes, recompute_share
from launcher.plan.memory import NF4_BYTES_PER_PARAM, MemoryOptions, trainable_params

# launcher.plan.planner.PlanInput: not imported, the planner imports this module (no import cycle, even type-only)
PlanInput = Any

# Achievable fraction of the dense bf16 peak for this project's compiled, packed, uncheckpointed training
# step of full weights (its GEMMs, attention kernels and elementwise work together). Hopper: calibrated on the
# committed H100/H200 runs (bench/suites/speed_calibration.py): 8B full fine-tuning on 2 and 4 GPUs at
# 8-10k tokens/GPU (47.4-49.6% MFU) and the 1B on one GPU at 16-32k (43-55%): the value that centres them.
# Other GPU types are not measured: the planner's earlier expected-MFU guesses stand in for them.
HOPPER_EFFICIENCY = 0.49
EFFICIENCY = {"h100": HOPPER_EFFICIENCY, "h100-nvl": HOPPER_EFFICIENCY, "gh200": HOPPER_EFFICIENCY,
              "h200": HOPPER_EFFICIENCY, "h100-pcie": 0.36, "b200": 0.35, "a100": 0.45, "a100-40gb": 0.42,
              "l40s": 0.35}
FALLBACK_EFFICIENCY = 0.30
# LoRA: the adapters' small matmuls, their extra reads of each target's input and the frozen weights' skipped
# gradients leave the GPU less dense work per token than the FLOP count credits. Measured: 8B LoRA (r 16, all
# linears) on 2 and 4 H100s at 8k tokens 36.5% and 41.0% MFU, the llama-70b shape's LoRA on 4 and QLoRA on 2
# H100s at 2,048 tokens with checkpointing 22.6% and 22.0% (eager), the 8B QLoRA on one H100 46.7% (compiled):
# the factor that centres them (their spread, 36%, is wider than the +-15% band: the one-GPU QLoRA run is
# listed off in bench/suites/speed_calibration.py).
LORA_EFFICIENCY = 0.82
# train.precision = "fp8" (float8 linears): step speed over bf16, measured on the 8B full fine-tune beside its
# bf16 baseline in the same call: 1.13x on 4 H100s (four-gpu-2026-11-27d/multi-4gpu-fp8.json) to 1.29x on 2 H200s
# (two-gpu-2026-11-28b/multi-2gpu-fp8-own-*.json, 1.24-1.29x); the middle of that range.
FP8_SPEEDUP = 1.2

# NCCL bus bandwidth (nccl-tests' busbw for large all-gathers / reduce-scatters), GB/s per GPU. Within a node:
# NVLink through NVSwitch (A100 600 GB/s and H100 900 GB/s bidirectional per GPU; nccl-tests reach ~230 and
# ~360); PCIe cards ~20. Across nodes: a ring per NIC, so the node's NICs together: DGX-class nodes with one
# 200 Gb/s HDR NIC per A100 (8 x 25 GB/s, ~185 reached) or one 400 Gb/s NDR per H100 (~370). A node with fewer
# NICs gets proportionally less. Datasheet and nccl-tests figures, not measured here.
INTRA_NODE_GBPS = {"a100": 230.0, "a100-40gb": 230.0, "h100": 360.0, "h100-nvl": 300.0, "gh200": 360.0,
                   "h200": 360.0, "b200": 700.0}
INTER_NODE_GBPS = {"a100": 185.0, "a100-40gb": 185.0, "h100": 370.0, "h100-nvl": 370.0, "gh200": 370.0,
                   "h200": 370.0, "b200": 370.0}
FALLBACK_LINK_GBPS = 20.0  # PCIe cards (l40s, h100-pcie, ...) and unknown GPUs: through the host
# Host <-> GPU copies (activation and CPU offload) while every GPU of the node copies: a PCIe 4.0 x16 link reaches
# ~25 GB/s each way, and DGX-class nodes put two GPUs behind each switch's host link: ~12.5 GB/s a GPU.
PCIE_GBPS = 12.5
# HBM bandwidth a memory-bound kernel reaches (QLoRA's dequantization), GB/s: ~70% of the datasheet's.
HBM_GBPS = {"a100": 1400.0, "a100-40gb": 1100.0, "h100": 2300.0, "h100-nvl": 2700.0, "gh200": 2800.0,
            "h200": 3300.0, "b200": 5500.0}
FALLBACK_HBM_GBPS = 600.0
# CPU offload's optimizer step: torch's AdamW over fp32 host tensors runs ~12 elementwise passes per
# parameter (~100 bytes of memory traffic) at a node's achievable DRAM bandwidth (~150 GB/s of a 2-socket
# server), shared by the node's ranks. Not measured on this project's runs yet (issue #55's offload run).
HOST_ADAMW_BYTES_PER_PARAM = 100
HOST_MEMORY_GBPS = 150.0
# The optimizer step on the GPU: fused AdamW reads fp32 weights, gradients and both moments and writes three of
# them back (28 bytes per trainable parameter of the rank's shard), memory-bound at HBM_GBPS.
ADAMW_BYTES_PER_PARAM = 28
BF16 = 2


@dataclass
class StepTime:
    """Where one optimizer step's time goes (seconds), and what it makes per second."""

    compute_s: float
    collectives_s: float  # all of FSDP's collectives in the step, overlapped or not
    exposed_collectives_s: float  # what of them adds to the step
    other_s: float  # dequantization, all-to-alls, offload copies and the host optimizer step
    step_s: float
    tokens_per_step: int  # real tokens over all GPUs
    tokens_per_s: float
    mfu: float  # model FLOPs per second per GPU over the bf16 peak


def memory_options(inp: PlanInput) -> MemoryOptions:
    """The memory model's view of a plan input (fields of the same names; world_size derived)."""
    names = {f.name for f in dataclasses.fields(MemoryOptions)} - {"world_size"}
    return MemoryOptions(world_size=inp.world_size, **{n: getattr(inp, n) for n in names})


def compute_seconds(shape: ModelShape, inp: PlanInput, per_token: float, tokens: float, peak: float) -> float:
    """One micro-batch's FLOPs (forward again with per-layer checkpointing, attention's only with
    train.recompute_attention) at the achievable fraction of the peak. LoRA's factor and FP8's speed-up are the linears': attention (6·L·a·s̄ of the count, its forward
    recomputed) runs in the same bf16 kernels either way, and at long documents it is most of the step."""
    share = _recomputed(shape, inp)  # of the decoder layers: train.checkpoint_layers
    recompute = 1 + forward_share(shape, inp, per_token) * share
    attention = shape.attention_flops_per_token(_attended(inp))
    counted = attention * (1 + share / 3)  # attention's forward is a third of its step
    linears = per_token * recompute - counted  # the rest of the step, its forward recomputed
    # train.recompute_attention = false: the checkpoints keep attention's outputs, its forward runs once
    attention = counted if inp.recompute_attention else attention
    base = peak * EFFICIENCY.get(inp.gpu_type.lower(), FALLBACK_EFFICIENCY)
    speed = (LORA_EFFICIENCY if inp.lora else 1.0) * (FP8_SPEEDUP if inp.fp8 else 1.0)
    return tokens * (attention + linears / speed) / base


def forward_share(shape: ModelShape, inp: PlanInput, per_token: float) -> float:
    """The forward's FLOPs over the step's: what per-layer checkpointing runs again. 2·N + 2·L·a·s̄ (+ 2·N_lora)
    of contract/shape.py's 6·N + 6·L·a·s̄ (4·N + 6·N_lora + ...): 1/3 for full weights, ~1/2 for LoRA."""
    # the lm_head runs outside the checkpointed decoder layers: its forward is not run again
    forward = shape.flops_per_token(_attended(inp), None) / 3 - 2 * shape.vocab * shape.hidden
    if inp.lora:
        forward += 2 * shape.active_lora_params(inp.lora_r, inp.lora_target_modules)
    return forward / per_token


def _recomputed(shape: ModelShape, inp: PlanInput) -> float:
    """The share of the decoder layers whose forward (and its collectives, its NF4 expansions) runs again."""
    return recompute_share(shape, memory_options(inp))


def _attended(inp: PlanInput) -> float:
    return min(inp.mean_doc_tokens, inp.micro_batch_tokens)


def _bus_gbps(inp: PlanInput, across_nodes: bool) -> float:
    """Within a node: the GPU type's links; across nodes: the profile's network_gbps, else the type's typical."""
    gpu = inp.gpu_type.lower()
    intra = INTRA_NODE_GBPS.get(gpu, FALLBACK_LINK_GBPS)
    network = inp.network_gbps or INTER_NODE_GBPS.get(gpu, FALLBACK_LINK_GBPS)
    return min(intra, network) if across_nodes else intra


def _hbm_gbps(inp: PlanInput) -> float:
    return HBM_GBPS.get(inp.gpu_type.lower(), FALLBACK_HBM_GBPS)


def _gathered_bytes(shape: ModelShape, inp: PlanInput) -> float:
    """The whole model as FSDP all-gathers it (bf16; QLoRA's targets in NF4); under expert parallelism
    without the experts, which stay where they live."""
    gathered = shape.total_params - _resident_expert_params(shape, inp)
    if inp.quant == "none":
        return BF16 * gathered
    quantized = shape.target_params(inp.lora_target_modules)
    return NF4_BYTES_PER_PARAM * quantized + BF16 * (gathered - quantized)


def _resident_expert_params(shape: ModelShape, inp: PlanInput) -> int:
    """The expert weights that expert parallelism neither gathers nor reduce-scatters (0 without it)."""
    return shape.expert_params if inp.expert_parallel > 1 else 0


def collective_seconds(shape: ModelShape, inp: PlanInput, trainable: int) -> float:
    """One micro-batch's collectives (seconds at the bus bandwidth, a ring's (n-1)/n of the bytes per GPU).
    FSDP / ZeRO-3: two all-gathers of the weights (forward; backward, recompute included) and a bf16
    reduce-scatter of the gradients over the world (hsdp: the gathers stay in the node; the node's shard of
    the gradients is all-reduced across nodes). DDP / ZeRO-2: an all-reduce of the gradients (2x the bytes)."""
    world, node = inp.world_size, inp.gpus_per_node
    across = inp.nodes > 1
    grads = BF16 * (trainable if inp.lora else trainable - _resident_expert_params(shape, inp))
    spec = inp.spec
    if inp.device == "cpu" or world == 1:
        return 0.0
    if not spec.sharded or (spec.engine == "deepspeed" and spec.zero_stage == 2):
        return 2 * grads * (world - 1) / world / (_bus_gbps(inp, across) * 1e9)
    gather = 2 * _gathered_bytes(shape, inp)
    if spec.shards == "node" and across:
        inside = (gather + grads) * (node - 1) / node / (_bus_gbps(inp, False) * 1e9)
        between = 2 * grads / node * (inp.nodes - 1) / inp.nodes / (_bus_gbps(inp, True) * 1e9)
        return inside + between
    return (gather + grads) * (world - 1) / world / (_bus_gbps(inp, across) * 1e9)


def _dequantize_seconds(shape: ModelShape, inp: PlanInput) -> float:
    """QLoRA: each NF4 weight is expanded to bf16 before its matmuls, in the forward, the recompute and the
    backward: memory-bound, reading NF4 and writing bf16 per weight. (Compiled layers keep the forward's expansion
    for the backward, launcher/plan/activations.py dequantized_weight_bytes: one pass fewer, ~1% of a 70B step on
    one H100; not counted, as the calibration's runs do not say which of them compiled.)"""
    if inp.quant == "none":
        return 0.0
    passes = 2 + _recomputed(shape, inp)
    quantized = shape.target_params(inp.lora_target_modules)
    return passes * quantized * (NF4_BYTES_PER_PARAM + BF16) / (_hbm_gbps(inp) * 1e9)


def _context_parallel_seconds(shape: ModelShape, inp: PlanInput, tokens: float) -> float:
    """Ulysses (train/kernels/context_parallel.py): per layer, q, k, v in and the attention output back, each an
    all-to-all of the GPU's tokens; the backward sends as much again, the recompute the forward's again.
    Attention waits on them: nothing hides them. The group sits inside a node (its links)."""
    n = inp.context_parallel
    if n <= 1:
        return 0.0
    per_layer = tokens * (2 * shape.q_dim + 2 * shape.kv_dim) * BF16 * (n - 1) / n
    passes = 2 + _recomputed(shape, inp)
    return passes * shape.layers * per_layer / (_bus_gbps(inp, False) * 1e9)


def _expert_parallel_seconds(shape: ModelShape, inp: PlanInput, tokens: float) -> float:
    """Expert parallelism (train/moe/expert_parallel.py): per MoE layer the k routed copies of the GPU's tokens
    go to their experts' GPUs and back (two all-to-alls), as many again in the backward, the forward's again
    in the recompute; the experts wait on them. Across nodes when the EP group spans them (its GPUs are
    world / N apart)."""
    n = inp.expert_parallel
    if n <= 1 or not shape.is_moe:
        return 0.0
    per_layer = 2 * tokens * shape.experts_per_token * shape.hidden * BF16 * (n - 1) / n
    passes = 2 + _recomputed(shape, inp)
    exchange = passes * shape.moe_layer_count * per_layer / (_bus_gbps(inp, n > inp.gpus_per_node) * 1e9)
    # Fewer EP ranks than GPUs: each GPU all-gathers its experts from the R = world / N consecutive GPUs holding
    # them as FSDP shards (forward, and the recompute), and reduce-scatters their gradients; in line, not prefetched.
    replicas = inp.world_size // n
    gathers = (passes - 1 + (0 if inp.lora else 1)) * BF16 * shape.expert_params * (replicas - 1) / replicas
    return exchange + gathers / (_bus_gbps(inp, replicas > inp.gpus_per_node) * 1e9)


def _activation_offload_seconds(shape: ModelShape, inp: PlanInput, options: MemoryOptions, compute_s: float) -> float:
    """train.activation_offload: each checkpointed layer input goes to pinned host memory in the forward and
    back in the backward, on a side stream: only what outlasts the compute adds to the step."""
    if not inp.activation_offload:
        return 0.0
    copies = 2 * offloaded_activation_bytes(shape, options) / (PCIE_GBPS * 1e9)  # out in forward, back in backward
    return max(0.0, copies - compute_s)


def _cpu_offload_seconds(inp: PlanInput, trainable: int, total_params: int) -> tuple[float, float]:
    """(per micro-batch, per step): FSDP's CPU offload copies each rank's fp32 shard to the GPU for the two
    all-gathers and its gradients back (PCIe); the optimizer step runs on the host over the node's shards."""
    if not inp.cpu_offload:
        return 0.0, 0.0
    shard = total_params / inp.world_size
    copies = (2 * 4 * shard + 4 * trainable / inp.world_size) / (PCIE_GBPS * 1e9)
    host = HOST_ADAMW_BYTES_PER_PARAM * trainable / inp.nodes / (HOST_MEMORY_GBPS * 1e9)
    return copies, host


def step_time(inp: PlanInput, per_token: float) -> StepTime | None:
    """The predicted step (see the module docstring); None where nothing is known to predict it with (CPU
    processes, a GPU type contract/gpus.py does not list). `per_token`: the planner's FLOPs per token."""
    spec = gpus.lookup(inp.gpu_type) if inp.device == "gpu" else None
    if spec is None:
        return None
    shape = ModelShape.from_arch(inp.arch)
    options = memory_options(inp)
    trainable = trainable_params(shape, options)
    peak = spec.peak_tflops_bf16 * 1e12
    tokens = inp.micro_batch_tokens * inp.packing_efficiency / inp.context_parallel  # real tokens per GPU
    compute = compute_seconds(shape, inp, per_token, tokens, peak)
    collectives = collective_seconds(shape, inp, trainable)
    # the first layer's gather and the last one's reduce have no compute beside them
    exposed = max(0.0, collectives - compute) + 2 * collectives / (shape.layers + 2)
    copies, host = _cpu_offload_seconds(inp, trainable, shape.total_params)
    other = (_dequantize_seconds(shape, inp) + _context_parallel_seconds(shape, inp, tokens)
             + _expert_parallel_seconds(shape, inp, tokens)
             + _activation_offload_seconds(shape, inp, options, compute) + copies)
    accumulation = inp.gradient_accumulation_steps
    optimizer = host or ADAMW_BYTES_PER_PARAM * trainable / inp.world_size / (_hbm_gbps(inp) * 1e9)
    step = accumulation * (compute + exposed + other) + optimizer
    per_step = tokens_per_step(inp)
    rate = per_step / step
    mfu = rate / inp.world_size * per_token / peak
    return StepTime(compute, collectives, exposed, other + optimizer / accumulation, step,
                    per_step, rate, mfu)


def tokens_per_step(inp: PlanInput) -> int:
    """Real tokens of one optimizer step over all GPUs (a context-parallel group shares its micro-batches)."""
    return int(inp.micro_batch_tokens * inp.packing_efficiency) * inp.gradient_accumulation_steps \
        * (inp.world_size // inp.context_parallel)


@dataclass
class TimeEstimate:
    flops_per_token: float
    expected_mfu: float | None
    tokens_per_step: int
    steps: int | None
    total_tokens: int | None
    tokens_per_s: float | None  # whole job
    step_time_s: float | None
    train_time_s: float | None  # compute only
    job_segments: int | None
    requeues: int | None
    eta_s: float | None  # compute + one startup per segment
    gpu_hours: float | None
    cost: float | None


def flops_per_token(shape: ModelShape, inp: PlanInput) -> float:
    """contract/shape.py's formula at the planned mean document length (a document longer than a
    micro-batch is cut to it). LoRA skips the frozen weights' gradients: 4N instead of 6N."""
    adapters = shape.active_lora_params(inp.lora_r, inp.lora_target_modules) if inp.lora else None
    return shape.flops_per_token(min(inp.mean_doc_tokens, inp.micro_batch_tokens), lora_params=adapters)


def estimate_time(shape: ModelShape, inp: PlanInput, lead_s: int | None = None) -> TimeEstimate:
    """Steps from dataset tokens (or max_steps); tokens/s from launcher/plan/speed.py's step time (or, with
    PlanInput.expected_mfu, MFU x peak x GPUs / FLOPs per token); segments = compute time / (time limit -
    startup - signal lead); cost = GPU-hours x price."""
    per_token = flops_per_token(shape, inp)
    predicted = step_time(inp, per_token)
    spec = gpus.lookup(inp.gpu_type)
    per_step = tokens_per_step(inp)
    steps = inp.max_steps if inp.max_steps > 0 else None
    if steps is None and inp.dataset_tokens is not None:
        steps = max(1, math.ceil(inp.dataset_tokens * inp.num_train_epochs / per_step))
    total = steps * per_step if steps is not None else None
    mfu, rate = (predicted.mfu, predicted.tokens_per_s) if predicted else (None, None)
    if inp.expected_mfu is not None and spec is not None and inp.device == "gpu":
        mfu = inp.expected_mfu
        rate = mfu * spec.peak_tflops_bf16 * 1e12 * inp.world_size / per_token
    step_s = per_step / rate if rate else None
    train_time = total / rate if (rate and total is not None) else None
    return with_segments(TimeEstimate(per_token, mfu, per_step, steps, total, rate, step_s, train_time,
                                      None, None, None, None, None), inp, lead_s)


def with_segments(time: TimeEstimate, inp: PlanInput, lead_s: int | None) -> TimeEstimate:
    """`time` with its segments, requeues, ETA, GPU-hours and cost for this signal lead (nothing else in the
    estimate depends on the lead)."""
    segments = requeues = eta = gpu_hours = cost = None
    if time.train_time_s is not None:
        segments = 1
        if inp.time_limit_s:
            usable = inp.time_limit_s - inp.startup_s - (lead_s or 0)
            segments = math.ceil(time.train_time_s / usable) if usable > 0 else None
        if segments is not None:
            requeues = segments - 1
            eta = time.train_time_s + segments * inp.startup_s
            gpu_hours = eta * inp.world_size / 3600
            cost = gpu_hours * inp.gpu_hour_price if inp.gpu_hour_price is not None else None
    return dataclasses.replace(time, job_segments=segments, requeues=requeues, eta_s=eta, gpu_hours=gpu_hours,
                               cost=cost)
