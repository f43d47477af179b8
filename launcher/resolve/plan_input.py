"""A resolved launch as the planner sees it: `plan_input_from_launch` (profile, model, train.toml,
time limit, dataset size -> `PlanInput`). One path from a launch to the planner, used by `sft-launch
plan`, every launch, `--dry-run` and the micro-batch fit (launcher/resolve/options.py -> launcher/plan/autofit.py).
It reads the launch through `LaunchView`, the fields it needs, so it never imports launcher/resolve/options.py
(which calls it while resolving).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Protocol

from contract import gpus
from contract.config import TrainConfig, fp8_linears
from contract.datacheck import DataCheck
from contract.shape import FUSED_LOSS_CHUNK_TOKENS
from contract.strategies import STRATEGIES
from launcher.plan.datasize import DataEstimate
from launcher.plan.planner import PlanInput
from launcher.resolve.presets import Preset
from launcher.resolve.profile import ClusterProfile
from launcher.resolve.plan_sources import SourceRow, estimate_source, mixture_estimate, source_rows

CPU_RAM_FRACTION = 0.9  # of a CPU node's RAM, shared by its processes (the OS and slurmstepd keep the rest)
_MEM = re.compile(r"^(?P<n>\d+(\.\d+)?)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_UNIT_GIB = {"K": 1 / 1024**2, "M": 1 / 1024, "": 1 / 1024, "G": 1.0, "T": 1024.0}  # SLURM's default unit is MB


class LaunchView(Protocol):
    """What the planner's view reads of a launch (launcher/resolve/options.py's `Launch` is one)."""

    profile: ClusterProfile
    preset: Preset
    train: TrainConfig
    nodes: int
    strategy: str
    time_limit_s: int
    executor: str
    data_checks: list[DataCheck]  # launcher/resolve/preflight.py's verdicts ([] before it ran)

    @property
    def mixed_precision(self) -> str: ...


def mem_gib(mem: str) -> float | None:
    """A profile's `mem` ("480G", "16000M", "2T"; SLURM units) in GiB; None for "" or "0" (unknown/all)."""
    match = _MEM.match(mem.strip())
    if not match or float(match["n"]) == 0:
        return None
    return float(match["n"]) * _UNIT_GIB[match["unit"].upper()]


def data_estimate(launch: LaunchView, rows: list[SourceRow] | None = None) -> DataEstimate | None:
    """Tokens of the training file ("" = the shipped sample), minus the share split off for eval; of one
    epoch of the mixture with [[data.sources]] (launcher/resolve/plan_sources.py; `rows`: its
    `source_rows`, when the caller has them already)."""
    data = launch.train.data
    if data.sources:
        return mixture_estimate(source_rows(launch) if rows is None else rows)
    estimate = estimate_source(launch, data.source_list()[0])
    check = next((c for c in launch.data_checks if not c.eval), None)
    if estimate is not None and not estimate.exact_rows and check is not None and estimate.rows:
        good = check.rows - check.bad_rows  # the check read every row: the count's mean x the rows there are
        scale = good / estimate.rows
        estimate = replace(estimate, tokens=round(estimate.tokens * scale), rows=good, exact_rows=True,
                           longer=round(estimate.longer * scale))
    if estimate is None or data.eval_path or not data.eval_fraction:
        return estimate
    keep = 1.0 - data.eval_fraction
    return replace(estimate, tokens=int(estimate.tokens * keep), rows=int(estimate.rows * keep),
                   method=f"{estimate.method}, {keep:.0%} after the eval split", longer=int(estimate.longer * keep))


def _precision(launch: LaunchView) -> str:
    return {"bf16": "bf16", "fp16": "fp16"}.get(launch.mixed_precision, "fp32")


def _device_fields(launch: LaunchView) -> dict[str, Any]:
    """GPU profiles: the GPU table decides memory. CPU profiles (gpus_per_node = 0): the processes shard
    with FSDP2 over gloo; planned as "ddp", a full replica each in its share of the node's RAM (an upper
    bound; unknown without `mem`)."""
    profile = launch.profile
    node_gib = mem_gib(profile.mem)
    if profile.gpus_per_node:
        return {"device": "gpu", "gpus_per_node": profile.gpus_per_node, "gpu_type": profile.gpu_type or "unknown",
                "strategy": launch.strategy, "cpu_offload": profile.cpu_offload, "cpu_mem_per_node_gib": node_gib}
    share = node_gib / profile.procs_per_node if node_gib else None
    return {"device": "cpu", "gpus_per_node": profile.procs_per_node, "gpu_type": "cpu", "strategy": "ddp",
            "gpu_memory_gib": share, "usable_gpu_fraction": CPU_RAM_FRACTION, "cpu_mem_per_node_gib": node_gib}


def _kernel_fields(launch: LaunchView) -> dict[str, Any]:
    """What train/engine/model.py will run, as far as memory goes: compiled decoder layers (contract.config's
    rule: train.compile, "auto" = on GPUs, except QLoRA over several ranks), the fused SwiGLU MLP
    (train.fused_mlp; "auto" = where contract.gpus allows it and quack-kernels is installed, assumed
    here; contract.config's asks_for_fused_mlp) and the fused loss's kernel (true = "fused" on GPUs, "chunked" on CPUs)."""
    t, on_gpu = launch.train.train, launch.profile.gpus_per_node > 0
    compiled = launch.train.compiles_decoder_layers(on_gpu, launch.nodes * launch.profile.procs_per_node)
    spec = gpus.lookup(launch.profile.gpu_type) if on_gpu else None
    blocker = gpus.fused_mlp_blocker(on_gpu, spec.compute_capability if spec else None, launch.train.lora.enabled,
                                     STRATEGIES[launch.strategy].zero_stage)
    fused_mlp = launch.train.asks_for_fused_mlp and (t.fused_mlp is True or blocker is None)
    backend = t.fused_loss if isinstance(t.fused_loss, str) else ("fused" if on_gpu else "chunked")
    return {"compile": compiled, "fused_mlp": fused_mlp, "loss_backend": backend}


def plan_input_from_launch(launch: LaunchView, data: DataEstimate | None = None) -> PlanInput:
    """The planner's view of a resolved launch (profile, model, train.toml, time limit, dataset size)."""
    cfg, t = launch.train, launch.train.train
    mean_doc = data.mean_tokens if data else None
    packing_efficiency = 0.97
    if not cfg.data.packing and mean_doc:  # padded batches: most of each row is padding
        packing_efficiency = min(1.0, max(0.01, mean_doc / t.model_max_length))
    return PlanInput(
        # The trained arch (--set model.arch.* overrides included), not only the preset's.
        arch=dict(cfg.model.arch or launch.preset.arch), nodes=launch.nodes, **_device_fields(launch),
        lora=cfg.lora.enabled, lora_r=cfg.lora.r, lora_target_modules=list(cfg.lora.target_modules),
        lora_dropout=cfg.lora.dropout, quant=cfg.lora.quant, gradient_checkpointing=t.gradient_checkpointing,
        micro_batch_tokens=cfg.micro_batch_tokens, gradient_accumulation_steps=t.gradient_accumulation_steps,
        context_parallel=cfg.parallel.context, expert_parallel=cfg.parallel.expert,
        activation_offload=t.activation_offload, mlp_chunk_tokens=t.mlp_chunk_tokens,
        recompute_attention=t.recompute_attention, checkpoint_layers=t.checkpoint_layers,
        precision=_precision(launch),  # type: ignore[arg-type]
        fp8=fp8_linears(t.fp8_recipe, t.fp8_all_gather) if t.precision == "fp8" else "",
        fp8_all_gather=t.precision == "fp8" and t.fp8_all_gather,
        loss_chunk_tokens=FUSED_LOSS_CHUNK_TOKENS if t.fused_loss else 0, **_kernel_fields(launch),
        dataset_tokens=data.tokens if data else None, packing_efficiency=packing_efficiency,
        mean_doc_tokens=mean_doc or 1024.0, num_train_epochs=t.num_train_epochs, max_steps=t.max_steps,
        # The local executor has no SLURM time limit: one segment, no requeues.
        time_limit_s=None if launch.executor == "local" else launch.time_limit_s,
        signal_lead_s=None if launch.executor == "local" else launch.profile.signal_lead_s,
        storage_write_gbps=launch.profile.storage_write_gbps, network_gbps=launch.profile.network_gbps,
        save_steps=t.save_steps, async_save=t.async_save,
        async_save_staging=t.async_save_staging,
        model_source="checkpoint" if cfg.model.path else "sharded" if cfg.model.init == "sharded" else "random",
    )
