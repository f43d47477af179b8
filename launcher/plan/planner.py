"""The planner: will a run fit, how long will it take, what will it cost — before anything is submitted.

Pure Python (no torch), instant on a login node. `make_plan(PlanInput) -> Plan` combines the memory
model (launcher/plan/memory.py, peak.py) with the speed model (launcher/plan/speed.py: compute and what
of communication and offload does not overlap it), the time limit (how many requeues) and the checkpoint
(launcher/plan/saves.py: its size, how early SLURM must signal the job so the save finishes, the save cadence). `plan_format.format_plan` renders a compact table, `plan_to_dict` the same for `--json`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from contract import gpus
from contract.config import ALL_LAYERS, Fp8Linears, TrainSection
from contract.parallel import context_blocker, expert_blocker, expert_sharding_blocker
from contract.schema import build, require
from contract.shape import LORA_TARGETS, ModelShape
from contract.strategies import STRATEGIES, PlannerStrategy, StrategySpec
from launcher.plan.host_memory import cpu_bytes_per_node, training_cpu_bytes
from launcher.plan.memory import GIB, MemoryBreakdown, trainable_params
from launcher.plan.peak import gpu_memory
from launcher.plan.saves import SaveCadence, checkpoint_bytes, save_cadence, signal_lead_seconds
from launcher.plan.speed import TimeEstimate, estimate_time, memory_options, tokens_per_step, with_segments

MAX_SUGGESTED_NODES = 64
CPU_USABLE_FRACTION = 0.9  # leave the OS, page cache and slurmstepd their share
GIB_F = float(GIB)


@dataclass
class PlanInput:
    arch: dict[str, Any]  # HF LlamaConfig key names
    nodes: int = 1
    gpus_per_node: int = 8
    gpu_type: str = "h100"
    # "cpu": CPU processes (FSDP2 over gloo, planned as "ddp": a full replica each, an upper bound);
    # each process's share of the node's RAM (gpu_memory_gib) plays the part of GPU memory, and there
    # is no MFU/time estimate.
    device: Literal["gpu", "cpu"] = "gpu"
    gpu_memory_gib: float | None = None  # overrides the GPU table (unknown GPU types)
    usable_gpu_fraction: float = 0.95  # headroom for allocator spikes the model does not see
    cpu_mem_per_node_gib: float | None = None  # profile `mem`; None = not checked
    strategy: PlannerStrategy = "fsdp"
    cpu_offload: bool = False
    lora: bool = False
    lora_r: int = 16
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    lora_dropout: float = 0.05
    quant: Literal["none", "nf4"] = "none"  # QLoRA: LoRA over an NF4 base (FSDP2 only)
    gradient_checkpointing: bool = True
    micro_batch_tokens: int = 8192  # packed tokens per micro-batch (per GPU; per context-parallel group)
    context_parallel: int = 1  # parallel.context: each micro-batch split over this many GPUs (Ulysses)
    expert_parallel: int = 1  # parallel.expert: each MoE layer's experts split over this many GPUs (all-to-all)
    activation_offload: bool = False  # train.activation_offload: saved activations in pinned host memory
    mlp_chunk_tokens: int = 0  # train.mlp_chunk_tokens: the MLP over chunks of this many tokens (0 = whole)
    recompute_attention: bool = True  # train.recompute_attention: false = checkpointing keeps attention's outputs
    checkpoint_layers: int | str = "all"  # train.checkpoint_layers: how many layers checkpointing recomputes
    gradient_accumulation_steps: int = 1
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    fp8: Fp8Linears = ""  # train.precision = "fp8": whose float8 linears the decoder layers run (contract.config.fp8_linears)
    fp8_all_gather: bool = False  # train.fp8_all_gather under fp8: torchao's weight wrapper (saves.sync_save_reason)
    loss_chunk_tokens: int = 0  # 0 = full logits; >0 = a chunked cross-entropy of this many tokens
    loss_backend: Literal["fused", "chunked", "liger"] = "fused"  # train.fused_loss's kernel (loss_chunk_tokens > 0)
    compile: bool = False  # train.compile resolved: decoder layers torch.compile'd (a smaller saved set)
    fused_mlp: bool = False  # train.fused_mlp resolved: the SwiGLU MLP in quack's GEMMs
    hold_outputs: bool = True  # training loop keeps `outputs` (the bf16 logits) through backward
    cpu_ram_efficient_loading: bool = True  # FSDP: only rank 0 materializes the full weights
    model_source: Literal["checkpoint", "random", "sharded"] = "checkpoint"  # memory.MemoryOptions says what each costs
    dataset_tokens: int | None = None  # counted or estimated from a sample; None = unknown
    packing_efficiency: float = 0.97  # real tokens / micro_batch_tokens after best-fit packing
    mean_doc_tokens: float = 1024.0  # s-bar of the attention FLOPs term
    num_train_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides epochs
    time_limit_s: int | None = None  # SLURM --time of one job segment
    # The lead the batch script asks SLURM for (profile.signal_lead_s, its one source); None: the
    # planner's own estimate of what the checkpoint needs stands in for it.
    signal_lead_s: int | None = None
    expected_mfu: float | None = None  # None = launcher/plan/speed.py's prediction; a number overrides it
    adamw_impl: Literal["fused", "foreach"] = "fused"  # train/engine/optim.py: fused; torch.optim.AdamW() default: foreach
    storage_write_gbps: float = 2.0  # shared-storage write bandwidth available to the job, GB/s
    node_write_gbps: float = 2.0  # one node's client write bandwidth, GB/s
    network_gbps: float = 0.0  # inter-node NCCL bus bandwidth per GPU, GB/s; 0 = speed.INTER_NODE_GBPS's for the GPU
    # The save settings default as [train] does (TrainSection's class attributes are its defaults).
    save_steps: int = TrainSection.save_steps  # train.save_steps
    async_save: bool = TrainSection.async_save  # train.async_save (saves.sync_save_reason: where it cannot be)
    async_save_staging: str = TrainSection.async_save_staging  # memory, disk, or auto (host_memory.save_staging)
    startup_s: float = 180.0  # per (re)start: imports, load + shard weights, resume
    gpu_hour_price: float | None = None  # currency per GPU-hour, for the cost line

    def validate(self) -> None:
        for key in ("nodes", "gpus_per_node", "micro_batch_tokens", "gradient_accumulation_steps", "lora_r",
                    "context_parallel", "expert_parallel", "save_steps"):
            require(getattr(self, key) >= 1, key, "must be >= 1")
        require(0 < self.usable_gpu_fraction <= 1, "usable_gpu_fraction", "must be in (0, 1]")
        require(0 < self.packing_efficiency <= 1, "packing_efficiency", "must be in (0, 1]")
        require(self.storage_write_gbps > 0 and self.node_write_gbps > 0, "storage_write_gbps", "must be > 0")
        require(self.network_gbps >= 0, "network_gbps", "must be >= 0")
        sharded = [name for name, spec in STRATEGIES.items() if spec.sharded]
        require(not self.cpu_offload or self.spec.sharded, "cpu_offload",
                f"needs a sharded strategy ({', '.join(sharded)}), not {self.strategy}")
        require(self.expected_mfu is None or 0 < self.expected_mfu <= 1, "expected_mfu", "must be in (0, 1]")
        require(self.max_steps == -1 or self.max_steps > 0, "max_steps", "must be -1 or > 0")
        require(self.quant == "none" or (self.lora and self.fsdp2),
                "quant", f"{self.quant!r} needs lora with FSDP2 (strategy fsdp or hsdp), not {self.strategy}")
        require(not self.fp8 or (self.device == "gpu" and not self.lora and self.spec.fsdp_version != 1
                                 and self.spec.engine != "deepspeed"),
                "fp8", "float8 linears train full weights on GPUs under FSDP2 (or DDP on one GPU)")
        layers = ModelShape.from_arch(self.arch).layers  # raises naming the arch key
        require(self.checkpoint_layers == ALL_LAYERS or int(self.checkpoint_layers) <= layers,
                "train.checkpoint_layers", f"{self.checkpoint_layers} is more than the model's {layers} decoder "
                "layers (all = every one)")
        require(self.context_blocker is None, "context_parallel", self.context_blocker or "")
        require(self.expert_blocker is None, "expert_parallel", self.expert_blocker or "")

    @property
    def context_blocker(self) -> str | None:
        """Why context_parallel cannot split this world and model's heads (contract.config's rule); None: it can."""
        shape = ModelShape.from_arch(self.arch)
        return context_blocker(self.context_parallel, self.world_size, shape.heads, shape.kv_heads)

    @property
    def expert_blocker(self) -> str | None:
        """Why expert_parallel cannot split this world and model's experts (contract.config's rule); None: it can."""
        fsdp2 = self.device == "cpu" or (self.spec.fsdp_version == 2 and self.spec.shards == "world")
        if self.expert_parallel > 1 and (blocker := expert_sharding_blocker(self.strategy, fsdp2, self.cpu_offload)):
            return blocker
        return expert_blocker(self.expert_parallel, self.world_size, ModelShape.from_arch(self.arch).experts,
                              self.arch.get("model_type"))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def spec(self) -> StrategySpec:
        return STRATEGIES[self.strategy]

    @property
    def fsdp2(self) -> bool:
        """The run shards with FSDP2: its strategy's, or any CPU run's (planned as "ddp", trained with FSDP2
        over gloo: train/engine/sharding.py)."""
        return self.device == "cpu" or (self.spec.engine == "fsdp" and self.spec.fsdp_version != 1)


def plan_input_from_dict(data: dict[str, Any]) -> PlanInput:
    """Validated PlanInput from a plain dict (JSON fixture, `plan_to_dict(plan)["input"]`)."""
    return build(PlanInput, data)


@dataclass
class Suggestion:
    change: dict[str, Any]  # PlanInput fields to set
    total_gib: float  # predicted per-GPU total with the change
    text: str


@dataclass
class ExpertOption:
    """One expert-parallel degree for a mixture-of-experts model: its experts per GPU, memory and speed."""

    expert_parallel: int
    experts_per_gpu: int
    fits: bool
    tokens_per_s: float | None


@dataclass
class Plan:
    input: PlanInput
    params_total: int
    params_trainable: int
    params_matmul: int
    params_active: int  # what one token uses (top-k experts of a MoE model); = params_total when dense
    gpu: MemoryBreakdown
    gpu_usable_bytes: int | None
    cpu: dict[str, int]
    cpu_usable_bytes: int | None
    suggestions: list[Suggestion]
    time: TimeEstimate
    checkpoint_bytes: int
    signal_lead_s: int
    warnings: list[str]
    cadence: SaveCadence | None = None
    experts: list[ExpertOption] = field(default_factory=list)  # MoE: the EP degrees, fastest that fits first

    @property
    def fits_gpu(self) -> bool | None:
        return None if self.gpu_usable_bytes is None else self.gpu.total <= self.gpu_usable_bytes

    @property
    def fits_cpu(self) -> bool | None:
        return None if self.cpu_usable_bytes is None else self.cpu["total"] <= self.cpu_usable_bytes

    @property
    def fits(self) -> bool | None:
        checks = [self.fits_gpu, self.fits_cpu]
        return False if False in checks else (None if self.fits_gpu is None else True)

    @property
    def verdict(self) -> str:
        device_memory = "GPU memory" if self.input.device == "gpu" else "RAM per process"
        if self.fits is None:
            return f"unknown ({device_memory} unknown" + (": set gpu_memory_gib)" if self.input.device == "gpu" else ")")
        if self.fits:
            return "fits"
        where = [name for name, ok in ((device_memory, self.fits_gpu), ("CPU RAM per node", self.fits_cpu))
                 if ok is False]
        return "does not fit: " + " and ".join(where)


def _gpu_usable_bytes(inp: PlanInput) -> int | None:
    spec = gpus.lookup(inp.gpu_type) if inp.device == "gpu" else None
    memory_gib = inp.gpu_memory_gib or (spec.memory_gib if spec else None)
    return None if memory_gib is None else int(memory_gib * inp.usable_gpu_fraction * GIB)


def _fits(inp: PlanInput) -> tuple[bool, int]:
    """(fits on GPU and CPU, per-GPU total bytes) — memory only, for the suggestion search."""
    shape = ModelShape.from_arch(inp.arch)
    opts = memory_options(inp)
    total = gpu_memory(shape, opts).total
    usable = _gpu_usable_bytes(inp)
    cpu_ok = inp.cpu_mem_per_node_gib is None or (
        cpu_bytes_per_node(shape, opts)["total"] <= inp.cpu_mem_per_node_gib * CPU_USABLE_FRACTION * GIB)
    return (usable is None or total <= usable) and cpu_ok, total


def _try(inp: PlanInput, text: str, **change: Any) -> Suggestion | None:
    ok, total = _fits(dataclasses.replace(inp, **change))
    return Suggestion(change, round(total / GIB_F, 1), text) if ok else None


def _smallest_nodes(inp: PlanInput, **extra: Any) -> Suggestion | None:
    """More nodes only help where state is sharded over the whole world (not hsdp/ddp)."""
    strategy = "fsdp" if inp.spec.shards != "world" else inp.strategy
    for nodes in range(inp.nodes + 1, MAX_SUGGESTED_NODES + 1):
        change = {"nodes": nodes, **extra} | ({"strategy": strategy} if strategy != inp.strategy else {})
        found = _try(inp, f"use {nodes} nodes" + "".join(f", {k}={v}" for k, v in change.items() if k != "nodes"),
                     **change)
        if found:
            return found
    return None


def _smaller_micro_batch(inp: PlanInput) -> Suggestion | None:
    """Halve the micro-batch, raising gradient accumulation so the tokens per step stay the same."""
    tokens, accumulation = inp.micro_batch_tokens // 2, inp.gradient_accumulation_steps * 2
    while tokens >= 256:
        found = _try(inp, f"micro_batch_tokens={tokens} with gradient_accumulation_steps={accumulation}",
                     micro_batch_tokens=tokens, gradient_accumulation_steps=accumulation)
        if found:
            return found
        tokens, accumulation = tokens // 2, accumulation * 2
    return None


def _context_parallel(inp: PlanInput) -> Suggestion | None:
    """The fewest GPUs of a node to split each sequence over (its all-to-alls stay on the node's links) that
    fit: documents stay whole, where a smaller micro-batch would cut the longer ones."""
    n = inp.context_parallel * 2
    while n <= inp.gpus_per_node:
        if dataclasses.replace(inp, context_parallel=n).context_blocker is None:
            found = _try(inp, f"split each sequence over {n} GPUs (context parallelism)", context_parallel=n)
            if found:
                return found
        n *= 2
    return None


def expert_options(inp: PlanInput) -> list[ExpertOption]:
    """A mixture-of-experts model's expert-parallel degrees that can split it (1, the powers of two that divide
    the GPUs and the experts, every GPU), ranked as the micro-batch search ranks its trials: those that fit
    first, then by predicted tokens/s."""
    shape = ModelShape.from_arch(inp.arch)
    if not shape.is_moe:
        return []
    options = []
    for n in sorted({1, inp.world_size} | {2 ** i for i in range(1, inp.world_size.bit_length())}):
        trial = dataclasses.replace(inp, expert_parallel=n)
        if n == 1 or trial.expert_blocker is None:
            rate = estimate_time(shape, trial).tokens_per_s
            options.append(ExpertOption(n, shape.experts // n, _fits(trial)[0], rate))
    return sorted(options, key=lambda o: (not o.fits, -(o.tokens_per_s or 0.0)))


def _expert_parallel(inp: PlanInput) -> Suggestion | None:
    """Split a mixture-of-experts model's experts over every GPU: no expert is ever gathered."""
    if inp.expert_parallel > 1 or dataclasses.replace(inp, expert_parallel=inp.world_size).expert_blocker:
        return None
    return _try(inp, f"split each MoE layer's experts over the {inp.world_size} GPUs (expert parallelism)",
                expert_parallel=inp.world_size)


def suggestions_for(inp: PlanInput) -> list[Suggestion]:
    """Settings that would make a non-fitting run fit, cheapest first; empty when it fits already."""
    if _fits(inp)[0]:
        return []
    candidates: list[Suggestion | None] = []
    if not inp.gradient_checkpointing:
        candidates.append(_try(inp, "enable gradient checkpointing", gradient_checkpointing=True))
    elif inp.checkpoint_layers != ALL_LAYERS:
        candidates.append(_try(inp, "checkpoint every decoder layer", checkpoint_layers=ALL_LAYERS))
    if not inp.cpu_ram_efficient_loading:
        candidates.append(_try(inp, "load weights on rank 0 only", cpu_ram_efficient_loading=True))
    candidates.append(_context_parallel(inp))
    if inp.world_size > 1 and ModelShape.from_arch(inp.arch).is_moe:
        candidates.append(_expert_parallel(inp))
    candidates.append(_smallest_nodes(inp))
    candidates.append(_smaller_micro_batch(inp))
    if inp.spec.sharded and not inp.cpu_offload and not inp.spec.no_cpu_offload:
        candidates.append(_try(inp, "enable CPU offload (slow)", cpu_offload=True))
    if not inp.lora:
        candidates.append(_try(inp, "train LoRA adapters instead of all weights", lora=True))
    if inp.quant == "none" and inp.spec.engine == "fsdp" and inp.spec.fsdp_version != 1 and inp.device == "gpu":
        candidates.append(_try(inp, "QLoRA: LoRA adapters over a 4-bit NF4 base", lora=True, quant="nf4"))
    found = [c for c in candidates if c is not None]
    if not found and not inp.gradient_checkpointing:
        found = [s for s in [_smallest_nodes(inp, gradient_checkpointing=True)] if s]
    return found


def frozen_experts(inp: PlanInput) -> str | None:
    """A LoRA run of a mixture-of-experts model whose targets reach no routed expert (one peer shipped a
    release that left them frozen without a word): said in the plan, not refused (attention-only LoRA is a choice)."""
    experts = inp.arch.get("num_experts") or inp.arch.get("num_local_experts")
    if not inp.lora or not experts or {"experts.gate_up_proj", "experts.down_proj"} & set(inp.lora_target_modules):
        return None
    return (f"LoRA leaves the {experts} routed experts of every layer frozen: lora.target_modules names neither "
            "experts.gate_up_proj nor experts.down_proj")


def make_plan(inp: PlanInput) -> Plan:
    """Memory breakdown, verdict + suggestions, time/cost and the signal lead for one launch."""
    inp.validate()
    shape = ModelShape.from_arch(inp.arch)
    opts = memory_options(inp)
    warnings = []
    if inp.device == "cpu":
        warnings.append("CPU processes: no MFU/time estimate")
    elif gpus.lookup(inp.gpu_type) is None:
        warnings.append(f"gpu_type {inp.gpu_type!r} is not in contract/gpus.py: no MFU/time estimate")
    if inp.spec.shards == "node" and inp.nodes == 1:
        warnings.append(f"{inp.strategy} on one node is plain full sharding")
    if inp.dataset_tokens is None and inp.max_steps <= 0:
        warnings.append("dataset size unknown and max_steps unset: no step count, ETA or cost")
    if frozen := frozen_experts(inp):
        warnings.append(frozen)
    trainable = trainable_params(shape, opts)
    ckpt = checkpoint_bytes(trainable, inp)
    time = estimate_time(shape, inp)  # the step time, which the signal lead needs (and the lead nothing of it)
    step_time = time.step_time_s
    lead = signal_lead_seconds(ckpt, inp, step_time)
    cpu_usable = None if inp.cpu_mem_per_node_gib is None else int(inp.cpu_mem_per_node_gib * CPU_USABLE_FRACTION * GIB)
    return Plan(
        input=inp, params_total=shape.total_params, params_trainable=trainable,
        params_matmul=shape.matmul_params, params_active=shape.active_params, gpu=gpu_memory(shape, opts), gpu_usable_bytes=_gpu_usable_bytes(inp),
        cpu=cpu_bytes_per_node(shape, opts), cpu_usable_bytes=cpu_usable, suggestions=suggestions_for(inp),
        time=with_segments(time, inp, inp.signal_lead_s or lead), checkpoint_bytes=ckpt, signal_lead_s=lead, warnings=warnings,
        cadence=save_cadence(ckpt, inp, step_time, lead, training_cpu_bytes(shape, opts), time.steps),
        experts=expert_options(inp) if inp.world_size > 1 else [],
    )


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """JSON-ready dict (bytes as integers); `plan_input_from_dict(d["input"])` rebuilds the input."""
    data = dataclasses.asdict(plan)
    data["gpu"] |= {"allocated": plan.gpu.allocated, "total": plan.gpu.total}
    data |= {"fits": plan.fits, "fits_gpu": plan.fits_gpu, "fits_cpu": plan.fits_cpu, "verdict": plan.verdict}
    return data

