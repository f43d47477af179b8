"""Sharding strategies: one table of what each name implies, used by the profile, the CLI, the
planner and memory model, the templates and the training side.

`fsdp`, `fsdp1`, `zero2`, `zero3` can be launched; `hsdp` and `ddp` exist for the planner only
(`sft-launch plan` compares against them; the templates do not render them yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StrategySpec:
    name: str
    title: str  # for plans and summaries
    engine: Literal["fsdp", "deepspeed", "ddp"]  # accelerate's distributed_type family
    shards: Literal["world", "node", "none"]  # over which ranks params/grads/optimizer state are split
    fsdp_version: int = 0  # 1 or 2 for engine fsdp
    zero_stage: int = 0  # 2 or 3 for engine deepspeed
    fp32_params: bool = False  # the wrapped model keeps fp32 weights (low precision only as a cast cache)
    launchable: bool = True  # the profile and --strategy may choose it
    gpu_only: str = ""  # why a CPU profile cannot run it; "" = it runs on CPU too (train/engine/sharding.py)
    no_cpu_offload: str = ""  # why profile.cpu_offload is refused with it; "" = offload works

    @property
    def config_files(self) -> tuple[str, ...]:
        """Run-directory files the strategy needs besides launch.slurm and train.toml."""
        return ("accelerate.yaml", "deepspeed.json") if self.engine == "deepspeed" else ("accelerate.yaml",)

    @property
    def sharded(self) -> bool:
        return self.shards != "none"


STRATEGIES: dict[str, StrategySpec] = {
    spec.name: spec
    for spec in [
        StrategySpec("fsdp", "FSDP2 full shard", "fsdp", "world", fsdp_version=2),
        StrategySpec("fsdp1", "FSDP1 full shard", "fsdp", "world", fsdp_version=1, fp32_params=True,
                     gpu_only="FSDP1 needs GPUs (its rank-0 weight broadcast, sync_module_states, is GPU-only)",
                     # bench/gpu_strategies.py on an H100 (2026-11-24, file removed in #33): with
                     # offload_params the resumed run started from the initial weights (Accelerate 1.15's
                     # FSDP1 sharded load).
                     no_cpu_offload="FSDP1 with CPU offload does not restore the weights on resume; "
                                    "use --strategy fsdp (FSDP2), whose CPU offload resumes exactly"),
        StrategySpec("hsdp", "FSDP2 hybrid shard", "fsdp", "node", fsdp_version=2, launchable=False),
        StrategySpec("zero2", "DeepSpeed ZeRO-2", "deepspeed", "world", zero_stage=2, gpu_only="DeepSpeed needs GPUs"),
        StrategySpec("zero3", "DeepSpeed ZeRO-3", "deepspeed", "world", zero_stage=3, gpu_only="DeepSpeed needs GPUs"),
        StrategySpec("ddp", "DDP / single GPU", "ddp", "none", fp32_params=True, launchable=False),
    ]
}
# ZeRO-3 keeps up to this many gathered parameters per GPU before releasing any (deepspeed.json's
# stage3_max_live_parameters; the planner counts them, launcher/plan/memory.py). Also the sub_group_size:
# the optimizer steps over fp32 partitions of at most this many elements at a time.
ZERO_MAX_LIVE_PARAMETERS = 1_000_000_000
ZERO_SUB_GROUP_SIZE = 1_000_000_000


def zero_reduce_bucket_size(hidden: int) -> int:
    """deepspeed.json's reduce_bucket_size in elements: hidden^2 (what Accelerate's "auto" sets). ZeRO copies
    each gradient into one of two buckets of this size to reduce it; a larger gradient bypasses them and
    keeps its own tensor (the planner counts both, launcher/plan/peak.py)."""
    return hidden * hidden
LAUNCHABLE: tuple[str, ...] = tuple(name for name, spec in STRATEGIES.items() if spec.launchable)
CPU_STRATEGIES: tuple[str, ...] = tuple(name for name in LAUNCHABLE if not STRATEGIES[name].gpu_only)
# For config dataclasses: the schema checks values against these Literals and names them in errors.
# Built from the table (Literal accepts a tuple at run time), so the names stay written once.
Strategy = Literal[LAUNCHABLE]  # type: ignore[valid-type]
PlannerStrategy = Literal[tuple(STRATEGIES)]  # type: ignore[valid-type]
