"""`sft-launch plan` and the plan every launch prints: validated `Launch` -> `PlanInput` -> `Plan`.

One path from a launch to the planner (`plan_input_from_launch`), used by the `plan` subcommand,
every launch and `--dry-run`. A launch whose plan does not fit is refused (exit 2) unless `--force`;
an unknown GPU type or memory size only warns. Pure Python, no torch: the CLI must stay instant.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import train.config
from launcher.datasize import DataEstimate, estimate_tokens
from launcher.memory import GIB
from launcher.options import Launch
from launcher.planner import Plan, PlanInput, Suggestion, format_plan, make_plan, plan_to_dict
from launcher.schema import ConfigError

if TYPE_CHECKING:
    from launcher.autofit import MicroBatchChoice

# train/loss.py's fused lm_head + cross-entropy materializes logits for 4096 tokens at a time on CPU
# (chunked); Liger's kernel on GPU keeps even less, so 4096 is the conservative figure for both.
FUSED_LOSS_CHUNK_TOKENS = 4096
MAX_NAMED = 3  # suggestions named in a refusal's one line
CPU_RAM_FRACTION = 0.9  # of a CPU node's RAM, shared by its processes (the OS and slurmstepd keep the rest)
SHIPPED_DATA = Path(train.config.__file__).resolve().parent / "assets" / "sample_chat.jsonl"
_MEM = re.compile(r"^(?P<n>\d+(\.\d+)?)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_UNIT_GIB = {"K": 1 / 1024**2, "M": 1 / 1024, "": 1 / 1024, "G": 1.0, "T": 1024.0}  # SLURM's default unit is MB


def mem_gib(mem: str) -> float | None:
    """A profile's `mem` ("480G", "16000M", "2T"; SLURM units) in GiB; None for "" or "0" (unknown/all)."""
    match = _MEM.match(mem.strip())
    if not match or float(match["n"]) == 0:
        return None
    return float(match["n"]) * _UNIT_GIB[match["unit"].upper()]


def data_estimate(launch: Launch) -> DataEstimate | None:
    """Tokens of the training file ("" = the shipped sample), minus the share split off for eval."""
    data = launch.train.data
    estimate = estimate_tokens(Path(data.path) if data.path else SHIPPED_DATA, launch.train.train.model_max_length)
    if estimate is None or data.eval_path or not data.eval_fraction:
        return estimate
    keep = 1.0 - data.eval_fraction
    return DataEstimate(int(estimate.tokens * keep), int(estimate.rows * keep),
                        f"{estimate.method}, {keep:.0%} after the eval split", estimate.exact_rows)


def _precision(launch: Launch) -> str:
    from launcher.render import mixed_precision  # jinja2 is imported lazily there; this stays light

    return {"bf16": "bf16", "fp16": "fp16"}.get(mixed_precision(launch), "fp32")


def _device_fields(launch: Launch) -> dict[str, Any]:
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
            "gpu_memory_gib": share, "usable_gpu_fraction": CPU_RAM_FRACTION}


def plan_input_from_launch(launch: Launch, data: DataEstimate | None = None) -> PlanInput:
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
        lora_dropout=cfg.lora.dropout, gradient_checkpointing=t.gradient_checkpointing,
        micro_batch_tokens=cfg.micro_batch_tokens, gradient_accumulation_steps=t.gradient_accumulation_steps,
        precision=_precision(launch),  # type: ignore[arg-type]
        loss_chunk_tokens=FUSED_LOSS_CHUNK_TOKENS if t.fused_loss else 0,
        dataset_tokens=data.tokens if data else None, packing_efficiency=packing_efficiency,
        mean_doc_tokens=mean_doc or 1024.0, num_train_epochs=t.num_train_epochs, max_steps=t.max_steps,
        # The local executor has no SLURM time limit: one segment, no requeues.
        time_limit_s=None if launch.executor == "local" else launch.time_limit_s,
        storage_write_gbps=launch.profile.storage_write_gbps,
    )


@dataclass
class LaunchPlan:
    plan: Plan
    data: DataEstimate | None
    micro_batch: MicroBatchChoice | None = None  # launcher/autofit.py's choice, shown under the header
    checked: list[str] = field(default_factory=list)  # launcher/preflight.py's data verdicts, one line each

    @property
    def text(self) -> str:
        data = self.data
        lines = format_plan(self.plan).splitlines()
        if self.micro_batch is not None:
            lines.insert(1, f"Micro   {self.micro_batch.describe()}")
        at = next((i for i, line in enumerate(lines) if line.startswith("Time ")), len(lines))
        lines[at:at] = [f"Checked {line}" for line in self.checked]
        if data is None:
            return "\n".join(lines)
        rows = f"{'' if data.exact_rows else '~'}{data.rows:,} rows" if data.rows else "rows unknown"
        lines.insert(at, f"Data    ~{data.tokens:,} tokens, {rows} (estimated: {data.method})")
        return "\n".join(lines)

    def to_json(self) -> str:
        extra = {"dataset": asdict(self.data) if self.data else None, "data_checked": self.checked,
                 "micro_batch": self.micro_batch.record() if self.micro_batch else None}
        return json.dumps(plan_to_dict(self.plan) | extra, indent=2)


def _launch_warnings(launch: Launch, plan: Plan) -> list[str]:
    profile, warnings = launch.profile, []
    if profile.gpus_per_node and not profile.gpu_type:
        warnings.append(f"profile '{launch.profile_name}' has no gpu_type: memory fit not checked "
                        "(set gpu_type to a launcher/gpus.py name)")
    if not profile.gpus_per_node and plan.input.gpu_memory_gib is None:
        warnings.append(f"profile '{launch.profile_name}' sets no mem: CPU RAM fit not checked")
    if launch.executor != "local" and profile.signal_lead_s < plan.signal_lead_s:
        warnings.append(f"signal_lead_s = {profile.signal_lead_s} s in the profile is below the {plan.signal_lead_s} s "
                        "the checkpoint save needs (set profile.signal_lead_s)")
    return warnings


def data_lines(launch: Launch) -> list[str]:
    """One line per checked data file (empty when launcher/preflight.py has not run)."""
    allow = launch.train.data.allow_bad_rows
    return [f"{Path(check.path).name}: {check.describe(allow)}" for check in launch.data_checks]


def plan_launch(launch: Launch) -> LaunchPlan:
    """Plan a resolved launch; launcher-level warnings (profile, dataset, signal lead) join the plan's."""
    data = data_estimate(launch)
    plan = make_plan(plan_input_from_launch(launch, data))
    plan.warnings += _launch_warnings(launch, plan)
    if launch.micro_batch is not None and launch.micro_batch.source == "none":
        plan.suggestions = launch.micro_batch.suggestions  # ways out under which a micro-batch fits
    return LaunchPlan(plan, data, launch.micro_batch, data_lines(launch))


def suggestion_flags(suggestion: Suggestion) -> str:
    """The command-line flags that apply a planner suggestion."""
    flags = {
        "nodes": lambda v: f"--nodes {v}", "strategy": lambda v: f"--strategy {v}",
        "gradient_checkpointing": lambda v: f"--gradient_checkpointing {str(v).lower()}",
        "micro_batch_tokens": lambda v: f"--set data.tokens_per_micro_batch={v}",
        "gradient_accumulation_steps": lambda v: f"--gradient_accumulation_steps {v}",
        "cpu_offload": lambda v: f"--set profile.cpu_offload={str(v).lower()}", "lora": lambda v: "--lora",
    }
    return " ".join(flags[key](value) for key, value in suggestion.change.items() if key in flags)


def refuse_unless_fits(report: LaunchPlan, force: bool) -> None:
    """Exit 2 (ConfigError) with one line naming the best suggestions when the plan does not fit."""
    plan = report.plan
    if plan.fits is not False or force:
        return
    usage = f"{plan.gpu.total / GIB:.1f} GiB per {'GPU' if plan.input.device == 'gpu' else 'process'}"
    if plan.fits_gpu is False and plan.gpu_usable_bytes:
        usage += f" of {plan.gpu_usable_bytes / GIB:.1f} usable"
    if plan.fits_cpu is False and plan.cpu_usable_bytes:
        usage += f", {plan.cpu['total'] / GIB:.1f} GiB RAM on node 0 of {plan.cpu_usable_bytes / GIB:.1f} usable"
    hint = "no single change found that fits"
    if plan.suggestions:
        hint = "try: " + "; or ".join(f"{s.text} ({suggestion_flags(s)})" for s in plan.suggestions[:MAX_NAMED])
    raise ConfigError(f"plan: {plan.verdict} ({usage}); {hint}; or pass --force to launch anyway")


def main(argv: list[str]) -> int:
    """`sft-launch plan [launch flags] [--json]`: print the plan; writes nothing, submits nothing."""
    from launcher.launch import build_parser, request_from_args
    from launcher.options import resolve

    parser = build_parser()
    parser.prog = "sft-launch plan"
    parser.description = "Plan a launch (memory per GPU, verdict, time, cost, signal lead); writes nothing."
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (for tools)")
    args = parser.parse_args(argv)
    launch = resolve(request_from_args(args))
    from launcher.preflight import check_launch

    check_launch(launch)
    report = plan_launch(launch)
    print(report.to_json() if args.json else report.text)
    return 0
