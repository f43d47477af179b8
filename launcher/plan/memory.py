"""Per-GPU and per-node memory model for LLaMA-family fine-tuning. Pure Python (no torch).

The starting point is the ZeRO paper's accounting for AdamW mixed precision (16 bytes per trainable
parameter: 2 bf16 params + 2 grads + 12 fp32 master/moments; ZeRO-3 and full sharding divide all of
it by the shard degree P), adapted to what the stacks we render really allocate:

* FSDP2/FSDP1 through Accelerate 1.15 with `mixed_precision: bf16`: `fsdp2_prepare_model` upcasts
  every trainable parameter to fp32, so the *sharded* parameters are the fp32 master weights
  (4 B/param), their gradients are fp32 shards (4 B), AdamW moments 8 B: still 16 B/param / P, but
  with no separate bf16 copy. `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)` makes the
  all-gathered (unsharded) layer weights and the unsharded gradients bf16: those are the per-layer
  communication buffers. Accelerate puts [final norm, lm_head (+ tied embedding)] in their own unit
  with `reshard_after_forward=False`, so lm_head stays unsharded from the loss to the start of backward.
* DeepSpeed ZeRO-2/3 with bf16: bf16 params (2 B; full copy in ZeRO-2), bf16 gradient partitions
  (`grad_accum_dtype` defaults to the model dtype), fp32 master (4 B) + moments (8 B) partitions.
* LoRA: the frozen base stays in its loaded dtype (bf16, 2 B, sharded like the params; fp32 under
  FSDP1, whose FlatParameter has one dtype) with no grads or optimizer state; only the adapters pay
  16 B/param (under ZeRO-3 they stay fp32, their own master copy, and compute in fp32: `adapter_bytes`).
  QLoRA (`quant = "nf4"`, FSDP2 only): the targeted linears cost NF4_BYTES_PER_PARAM (sharded, and
  all-gathered a layer at a time in NF4), the embedding, lm_head and norms stay bf16, and each matmul
  dequantizes one weight into a bf16 buffer.

Calibrated against 8 peaks measured on H200s (tests/fixtures/memory_calibration.json, written by
bench/memory_calibration.py): the *allocated* prediction is what `torch.cuda.max_memory_allocated`
sees (tensors only: the CUDA context and NCCL's buffers live outside torch's allocator and are only in
`total`), and `reserved` (`max_memory_reserved`) adds what the caching allocator keeps but cannot reuse.

This module holds the options, the breakdown and what the model state costs (parameters, gradients,
optimizer moments, master weights); launcher/plan/activations.py what scales with the micro-batch's
tokens (activations, logits); launcher/plan/peak.py adds the communication buffers and temporaries of
each phase of a step and takes the peak (gpu_memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.config import Fp8Linears
from contract.shape import NF4_BLOCK_SIZE, NF4_QUANT_UNIT, ModelShape
from contract.strategies import STRATEGIES, StrategySpec

GIB = 1024**3

CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # CUDA context + cuBLAS workspaces; invisible to torch's allocator
NCCL_BYTES = int(0.5 * GIB)  # NCCL communicator buffers (channels x peers), allocated outside torch
NCCL_MULTI_NODE_EXTRA_BYTES = int(0.25 * GIB)  # extra IB/network proxies when ranks span nodes
ALLOCATOR_SLACK = 0.08  # minimum reserved - allocated (caching-allocator rounding/splits), as a fraction
# of the memory allocated and freed every step (see _cached_not_reused)
DDP_BUCKET_BYTES = 25 * 1024**2  # torch DDP bucket_cap_mb default


@dataclass
class MemoryOptions:
    """What the memory model needs from a plan input (kept separate so memory.py has no planner import)."""

    strategy: str  # a name in contract.strategies.STRATEGIES
    world_size: int
    gpus_per_node: int
    nodes: int
    micro_batch_tokens: int
    gradient_checkpointing: bool
    cpu_offload: bool
    precision: str  # bf16 / fp16 / fp32
    lora: bool
    lora_r: int
    lora_target_modules: list[str]
    lora_dropout: float
    loss_chunk_tokens: int  # 0 = full logits; else a chunked cross-entropy over this many tokens
    hold_outputs: bool  # the training loop keeps `outputs` (bf16 logits) alive through backward
    cpu_ram_efficient_loading: bool
    gradient_accumulation_steps: int = 1  # > 1: gradients stay allocated between micro-batches
    adamw_impl: str = "fused"  # fused (train/engine/optim.py) or foreach (torch's default: fp32 sqrt(v) temporaries)
    device: str = "gpu"  # "cpu": CPU processes (gloo) have no CUDA context or NCCL buffers
    quant: str = "none"  # QLoRA: "nf4" = the targeted frozen linears in 4-bit NF4 (train/engine/qlora.py)
    fp8: Fp8Linears = ""  # whose float8 linears (contract.config.fp8_linears): what they save, their transient casts
    compile: bool = False  # train.compile: torch.compile per decoder layer (a smaller saved set)
    # Where the weights come from (model.path / model.init): "checkpoint" (read; FSDP: rank 0 only), "random"
    # (every rank draws the whole model on its CPU), "sharded" (each rank draws its shards on its GPU).
    model_source: str = "checkpoint"
    fused_mlp: bool = False  # train.fused_mlp: the SwiGLU MLP in quack's GEMMs (train/kernels/swiglu.py)
    loss_backend: str = "fused"  # with loss_chunk_tokens > 0: fused (gradients in the forward), chunked, liger
    context_parallel: int = 1  # parallel.context: each micro-batch split over this many GPUs
    expert_parallel: int = 1  # parallel.expert: each MoE layer's experts split over this many GPUs
    activation_offload: bool = False  # train.activation_offload: the forward's saved activations on the host
    mlp_chunk_tokens: int = 0  # train.mlp_chunk_tokens: the MLP's intermediate for this many tokens at a time
    recompute_attention: bool = True  # train.recompute_attention: false = checkpointing keeps attention's outputs
    checkpoint_layers: int | str = "all"  # train.checkpoint_layers: how many layers checkpointing recomputes

    @property
    def spec(self) -> StrategySpec:
        return STRATEGIES[self.strategy]

    @property
    def sequence_tokens(self) -> int:
        """The tokens of a micro-batch one GPU holds: its 1/N share under context parallelism."""
        return ceil_div(self.micro_batch_tokens, self.context_parallel)


@dataclass
class MemoryBreakdown:
    """Per-GPU bytes at the peak moment of a training step (`peak_phase`), with one note per term."""

    parameters: int
    gradients: int
    optimizer_states: int
    master_weights: int
    activations: int
    logits_loss: int
    comm_buffers: int
    optimizer_temporaries: int  # nonzero only when the peak is the optimizer step
    allocator_slack: int
    cuda_context_nccl: int
    peak_phase: str
    notes: dict[str, str] = field(default_factory=dict)

    TERMS = ("parameters", "gradients", "optimizer_states", "master_weights", "activations",
             "logits_loss", "comm_buffers", "optimizer_temporaries", "allocator_slack", "cuda_context_nccl")

    @property
    def allocated(self) -> int:
        """What torch.cuda.max_memory_allocated should report: the tensors only."""
        return (self.parameters + self.gradients + self.optimizer_states + self.master_weights
                + self.activations + self.logits_loss + self.comm_buffers + self.optimizer_temporaries)

    @property
    def reserved(self) -> int:
        """What torch.cuda.max_memory_reserved should report: tensors + the allocator's cached blocks."""
        return self.allocated + self.allocator_slack

    @property
    def total(self) -> int:
        return self.reserved + self.cuda_context_nccl


def shard_degree(opts: MemoryOptions) -> int:
    """ddp replicates; hsdp shards inside a node and replicates across nodes; the rest shard over all."""
    return {"none": 1, "node": opts.gpus_per_node, "world": opts.world_size}[opts.spec.shards]


# NF4 (train/engine/qlora.py): 4-bit codes, an int8 absmax per 64 weights, one bf16 factor per 256 of those.
NF4_BYTES_PER_PARAM = 0.5 + 1 / NF4_BLOCK_SIZE + 2 / NF4_QUANT_UNIT


def frozen_base_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """The frozen base of a LoRA run, unsharded: `elem` bytes per weight, NF4 for QLoRA's targets."""
    if opts.quant == "none":
        return elem * shape.total_params
    quantized = shape.target_params(opts.lora_target_modules)
    return int(NF4_BYTES_PER_PARAM * quantized) + elem * (shape.total_params - quantized)


def gathered_layer_bytes(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """One decoder layer as FSDP all-gathers it: `elem` bytes per weight; QLoRA: NF4 targets + `elem`-byte
    norms/untargeted weights. Expert parallelism gathers no expert: the layer's rest, plus this GPU's own
    experts cast to the compute dtype (train/moe/expert_parallel.py)."""
    layer = shape.gathered_layer_params(opts.expert_parallel)
    if opts.quant == "none":
        return elem * layer
    quantized = shape.target_params(opts.lora_target_modules) // shape.layers
    return int(NF4_BYTES_PER_PARAM * quantized) + elem * (layer - quantized)


def dequantize_buffer(shape: ModelShape, opts: MemoryOptions, elem: int) -> int:
    """QLoRA's matmul dequantizes one weight at a time into the compute dtype (train/engine/qlora.py)."""
    if opts.quant == "none":
        return 0
    return elem * max(n_in * n_out for n_in, n_out in shape.linear_dims(opts.lora_target_modules))


def trainable_params(shape: ModelShape, opts: MemoryOptions) -> int:
    """Parameters that get gradients and optimizer state: the LoRA adapters, or the whole model."""
    return shape.lora_params(opts.lora_r, opts.lora_target_modules) if opts.lora else shape.total_params


def trainable_tensor_sizes(shape: ModelShape, opts: MemoryOptions) -> list[int]:
    """Elements of every trainable tensor (ZeRO buckets gradients one tensor at a time): each weight of
    the model (an expert projection is one [E, ., .] tensor), or LoRA's A and B of each adapted weight."""
    if opts.lora:
        return shape.lora_tensor_sizes(opts.lora_r, opts.lora_target_modules)
    return shape.parameter_tensor_sizes()


def low_bytes(opts: MemoryOptions) -> int:
    """Bytes per element of the low-precision copies (bf16/fp16 weights, activations); 4 under fp32."""
    return 4 if opts.precision == "fp32" else 2


def ceil_div(n: float, p: int) -> int:
    """Bytes per shard: the last shard is padded up."""
    return int(-(-n // p))


def adapter_bytes(opts: MemoryOptions, elem: int) -> int:
    """Bytes per element the LoRA adapters compute in. apply_lora (train/engine/model.py) makes them fp32;
    FSDP2's policy gathers them in bf16 and ZeRO-2's engine casts every parameter to the model dtype
    (`_cast_module_mixed_precision`, deepspeed/runtime/engine.py). ZeRO-3 builds the model inside
    zero.Init (zero3_init_flag, templates/accelerate.yaml.j2), DeepSpeed skips that cast for such a
    model, and the adapters added after it are partitioned as they are (`_convert_to_zero_parameters`):
    they stay fp32, and PEFT casts each adapted linear's input up to them (`_cast_input_dtype`)."""
    return 4 if opts.lora and opts.spec.zero_stage == 3 else elem


def state_bytes(shape: ModelShape, opts: MemoryOptions) -> dict[str, tuple[int, str]]:
    """Persistent per-GPU model state: params, grads, optimizer moments, fp32 master (bytes, note).

    Trainable params cost 16 B each (see module docstring); where each byte lives depends on the
    strategy. With CPU offload, FSDP moves params+grads+moments to host; ZeRO-2 offloads the optimizer
    (fp32 master, moments, and the fp32 grad partitions it steps on); ZeRO-3 offloads params as well.
    """
    p = shard_degree(opts)
    trainable = trainable_params(shape, opts)
    frozen = shape.total_params if opts.lora else 0
    low = low_bytes(opts)
    zero3, off = opts.spec.zero_stage == 3, opts.cpu_offload
    if opts.spec.engine != "deepspeed":  # FSDP/DDP: the trainable params are themselves fp32 (Accelerate upcast / autocast)
        # FSDP1 flattens a layer into one FlatParameter of one dtype: the frozen base stays fp32 too
        # (train/engine/model.py weights_dtype).
        # Its gradient covers the whole FlatParameter, frozen elements included (torch's FSDP docs; 136M
        # LoRA on an H100: +0.5 GiB). With CPU offload the low-precision gradients stay on the GPU until
        # their copies to the host finish at the end of backward (136M on an H100: +0.29 GiB).
        fsdp1 = opts.spec.fsdp_version == 1
        frozen_bytes = 4 if fsdp1 else low
        base = frozen_base_bytes(shape, opts, frozen_bytes) if frozen else 0
        gpu_params = 0 if off else ceil_div(4 * trainable + base, p)
        what = f"fp32 adapters + {frozen_bytes}B frozen base" if frozen else "fp32 (= master)"
        if frozen and opts.quant != "none":
            what = f"fp32 adapters + {opts.quant} frozen linears ({NF4_BYTES_PER_PARAM:.3f}B)"
        grads = ceil_div(low * trainable, p) if off else ceil_div(4 * (trainable + (frozen if fsdp1 else 0)), p)
        return {
            "parameters": (gpu_params, f"{what}, /{p}" + (" (on CPU)" if off else "")),
            "gradients": (grads, f"{low if off else 4}B, /{p}" + (" (until copied to CPU)" if off else "")),
            "optimizer_states": (0 if off else ceil_div(8 * trainable, p), f"AdamW m+v fp32, /{p}"),
            "master_weights": (0, "none: the fp32 params are the master copy"),
        }
    param_shard = p if zero3 else 1
    # ZeRO-3's fp32 LoRA adapters (adapter_bytes) are their own master copy: stage3.py's
    # _create_fp32_partitions reuses a partition that already has the master dtype.
    trainable_bytes = adapter_bytes(opts, low)
    params = 0 if (off and zero3) else ceil_div(trainable_bytes * trainable + low * frozen, param_shard)
    return {
        "parameters": (params, f"{trainable_bytes}B trainable + {low}B frozen params, /{param_shard}" if frozen
                       else f"{low}B params, /{param_shard}"),
        "gradients": (0 if off else ceil_div(low * trainable, p), f"{low}B grad partitions, /{p}"),
        "optimizer_states": (0 if off else ceil_div(8 * trainable, p), f"AdamW m+v fp32, /{p}"),
        "master_weights": (0 if (off or trainable_bytes == 4) else ceil_div(4 * trainable, p), f"fp32 master, /{p}"),
    }
