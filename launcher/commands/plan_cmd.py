"""`sft-launch plan` and the plan every launch prints: validated `Launch` -> `PlanInput` -> `Plan`.

The launch reaches the planner through `launcher/resolve/plan_input.py`, for the `plan` subcommand, every
launch and `--dry-run`. A launch whose plan does not fit is refused (exit 2) unless `--force`;
an unknown GPU type or memory size only warns. Where SLURM answers, the job is also checked against
its partition (`launcher/ops/partition.py`): a job the partition can never run is refused, `--force` or
not. `sft-launch plan` prints the plan and exits EXIT_DOES_NOT_FIT (3) when the job does not fit
(memory, partition or disk), 0 when it does. Pure Python, no torch: the CLI must stay instant.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contract.schema import ConfigError
from contract.shape import rope_factor
from launcher.plan.autofit import context_parallel_for
from launcher.plan.datasize import DataEstimate, holding_length
from launcher.plan.memory import GIB
from launcher.ops.partition import ClusterCheck, check_cluster
from launcher.plan.plan_format import format_plan, suggestion_flags
from launcher.resolve.datarules import check_fills_one_step, describe as describe_overlap
from launcher.resolve.plan_input import data_estimate, plan_input_from_launch
from launcher.resolve.plan_sources import source_rows, source_table
from launcher.resolve.presets import model_dir
from launcher.plan.planner import Plan, make_plan, plan_to_dict
from launcher.resolve.storage import CACHE_BYTES_PER_TOKEN, EXPORT_BYTES_PER_PARAM, Filesystem, refusal, require_room, \
    room_warnings, run_writes

if TYPE_CHECKING:
    from contract.datacheck import DataCheck
    from launcher.plan.autofit import MicroBatchChoice
    from launcher.resolve.options import Launch

MAX_NAMED = 3  # suggestions named in a refusal's one line
EXIT_DOES_NOT_FIT = 3  # `sft-launch plan`: the plan was made and says the job does not fit


@dataclass
class LaunchPlan:
    plan: Plan
    data: DataEstimate | None
    micro_batch: MicroBatchChoice | None = None  # launcher/plan/autofit.py's choice, shown under the header
    checked: list[str] = field(default_factory=list)  # launcher/resolve/preflight.py's data verdicts, one line each
    disk: list[Filesystem] = field(default_factory=list)  # launcher/resolve/storage.py: what the run writes, where
    sources: list[str] = field(default_factory=list)  # a mixture's table (launcher/resolve/plan_sources.py)
    cluster: ClusterCheck | None = None  # launcher/ops/partition.py: the job against its partition
    lengths: list[str] = field(default_factory=list)  # model_max_length auto, RoPE stretched (`length_lines`)

    @property
    def fits(self) -> bool:
        """False when memory, the partition or the disk says the job cannot run (unknown memory counts as
        fitting); a launch refuses each of them (the disk and memory unless --force)."""
        return (self.plan.fits is not False and not (self.cluster and self.cluster.problems)
                and all(fs.fits for fs in self.disk))

    @property
    def text(self) -> str:
        data = self.data
        lines = format_plan(self.plan).splitlines()
        if self.micro_batch is not None:
            lines.insert(1, f"Micro   {self.micro_batch.describe()}")
        lines[1:1] = self.lengths
        at = next((i for i, line in enumerate(lines) if line.startswith("Time ")), len(lines))
        lines[at:at] = ([f"Checked {line}" for line in self.checked] + self.sources
                        + [line for fs in self.disk for line in _disk_lines(fs)])
        if self.cluster is not None:
            lines[at:at] = [f"Cluster {self.cluster.line}", *(f"  {p}" for p in self.cluster.problems)]
        if data is None:
            return "\n".join(lines)
        rows = f"{'' if data.exact_rows else '~'}{data.rows:,} rows" if data.rows else "rows unknown"
        lines.insert(at, f"Data    ~{data.tokens:,} tokens, {rows} (estimated: {data.method})")
        return "\n".join(lines)

    def to_json(self) -> str:
        extra = {"dataset": asdict(self.data) if self.data else None, "data_checked": self.checked,
                 "data_sources": self.sources,
                 "micro_batch": self.micro_batch.record() if self.micro_batch else None, "lengths": self.lengths,
                 "disk": [asdict(fs) | {"total": fs.total, "room": fs.room} for fs in self.disk],
                 "cluster": asdict(self.cluster) if self.cluster else None, "job_fits": self.fits}
        return json.dumps(plan_to_dict(self.plan) | extra, indent=2)


def _disk_lines(fs: Filesystem) -> list[str]:
    return [f"Disk    {fs.describe()}"] if fs.fits else [f"Disk    {refusal(fs)}"]


def _launch_warnings(launch: Launch, plan: Plan, cluster: ClusterCheck | None) -> list[str]:
    profile, warnings = launch.profile, []
    if profile.gpus_per_node and not profile.gpu_type:
        warnings.append(f"profile '{launch.profile_name}' has no gpu_type: memory fit not checked "
                        "(set gpu_type to a contract/gpus.py name)")
    if not profile.gpus_per_node and plan.input.gpu_memory_gib is None:
        warnings.append(f"profile '{launch.profile_name}' sets no mem: CPU RAM fit not checked")
    if launch.executor != "local" and profile.signal_lead_s < plan.signal_lead_s:
        warnings.append(f"signal_lead_s = {profile.signal_lead_s} s in the profile is below the {plan.signal_lead_s} s "
                        "the checkpoint save needs (set profile.signal_lead_s)")
    requeues = plan.time.requeues
    if launch.executor != "local" and requeues is not None and requeues > profile.max_timeouts:
        warnings.append(f"the run needs ~{requeues} time-limit requeues but max_timeouts = {profile.max_timeouts}: "
                        "it stops early (raise profile.max_timeouts or --time)")
    grace = cluster.grace_time_s if cluster else None
    if grace and grace < plan.signal_lead_s:  # 0: no GraceTime set, as on partitions without preemption
        cadence = plan.cadence
        lost = f" (up to {cadence.lost_steps:,} steps: the Preempt line)" if cadence and cadence.lost_steps else ""
        warnings.append(f"partition {profile.partition or '(default)'} has GraceTime={grace} s, below the "
                        f"{plan.signal_lead_s} s the checkpoint save needs: if its jobs can be preempted, SLURM "
                        f"kills a preempted job mid-save and it resumes from its previous checkpoint{lost}")
    return warnings


def long_documents(plan: Plan, data: DataEstimate | None, model_max_length: int) -> str | None:
    """Documents longer than model_max_length are cut to it when tokenized (train/dataset/load.py): one line
    before the queue, how many, the longest, and what keeps them whole (a model_max_length that holds the
    longest, split over the fewest GPUs that fit it: --context_parallel)."""
    if data is None or not data.longer:
        return None
    need = holding_length(data.longest)
    split = context_parallel_for(plan.input, need)
    keep = f"--model_max_length {need}" + (f" --context_parallel {split}" if split and split > 1 else "")
    how = f"whole with {keep}" if split else \
        f"a {need}-token sequence does not fit even split over the node's {plan.input.gpus_per_node} GPUs"
    return (f"~{data.longer:,} document(s) longer than model_max_length {model_max_length} (longest ~{data.longest:,} "
            f"tokens; {data.lengths or 'estimated'}) are cut to it; {how}")


def length_lines(launch: Launch) -> list[str]:
    """What model_max_length = "auto" resolved to (launcher/resolve/max_length.py), and whether the training
    stretches RoPE to reach model_max_length (train/engine/model.py's apply_rope_scaling, the same factor)."""
    lines = [f"Length  {launch.auto_length.describe()}"] if launch.auto_length else []
    length = launch.train.train.model_max_length
    context = (launch.train.model.arch or launch.preset.arch).get("max_position_embeddings")
    factor = rope_factor(length, context) if isinstance(length, int) else None
    if factor is None:
        return lines
    own = _own_rope_type(launch)
    if not launch.train.model.rope_scaling:
        lines.append(f"RoPE    not stretched (model.rope_scaling = false): positions past the model's {context:,} are "
                     f"untrained up to model_max_length {length:,}")
    elif own:
        lines.append(f"RoPE    the model's own {own!r} scaling is kept (not stretched again) for model_max_length "
                     f"{length:,} past its {context:,} positions")
    else:
        lines.append(f"RoPE    stretched x{factor} (linear): the model's {context:,} positions -> model_max_length "
                     f"{length:,}")
    return lines


def _own_rope_type(launch: Launch) -> str | None:
    """The RoPE scaling the model's config.json already has (train then leaves RoPE as it is); None: default
    RoPE, or the config is not here (a preset planned before its download)."""
    path = launch.train.model.path
    directory = model_dir(path, launch.profile.hf_home) if path else None
    try:
        values = json.loads((directory / "config.json").read_text(encoding="utf-8")) if directory else {}
    except (OSError, ValueError):
        return None
    rope = values.get("rope_parameters") or values.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") if isinstance(rope, dict) else None
    return kind if kind and kind != "default" else None


def data_lines(launch: Launch) -> list[str]:
    """One line per checked data file (empty when launcher/resolve/preflight.py has not run)."""
    allow = launch.train.data.allow_bad_rows
    overlap = [describe_overlap(launch.eval_overlap)] if launch.eval_overlap else []
    return [f"{_checked_name(launch, check)}: {check.describe(allow)}" for check in launch.data_checks] + overlap


def _checked_name(launch: Launch, check: DataCheck) -> str:
    """The file's name; with several sources, which source (and whether its eval data) it is."""
    shown = Path(check.path).name if Path(check.path).is_absolute() else check.path  # a hub id in full
    if check.eval and Path(check.path).is_file() and check.files:  # a file's eval_split: the files beside it
        shown = ", ".join(check.files)
    if not launch.train.data.sources:
        return shown
    label = f"{check.name}{' (eval)' if check.eval else ''}"
    return label if shown == check.name else f"{label} {shown}"


def plan_launch(launch: Launch) -> LaunchPlan:
    """Plan a resolved launch; launcher-level warnings (profile, dataset, signal lead) join the plan's."""
    rows = source_rows(launch) if launch.train.data.sources else []  # each source estimated once
    data = data_estimate(launch, rows)
    plan = make_plan(plan_input_from_launch(launch, data))
    cluster = check_cluster(launch)  # the one `scontrol show partition` of the plan
    plan.warnings += _launch_warnings(launch, plan, cluster)
    plan.warnings += check_fills_one_step(launch, plan)
    if (long := long_documents(plan, data, launch.train.train.model_max_length)) is not None:
        plan.warnings.append(long)
    if launch.micro_batch is not None and launch.micro_batch.source == "none":
        plan.suggestions = launch.micro_batch.suggestions  # ways out under which a micro-batch fits
    disk = disk_needs(launch, plan, data)
    plan.warnings += room_warnings(disk)
    return LaunchPlan(plan, data, launch.micro_batch, data_lines(launch), disk, source_table(launch, plan, rows),
                      cluster, length_lines(launch))


def disk_needs(launch: Launch, plan: Plan, data: DataEstimate | None) -> list[Filesystem]:
    """Checkpoints (K kept + 1 being written), the export and the tokenized cache, by file system."""
    cfg, lora = launch.train, launch.train.lora
    exported = plan.params_total  # full fine-tuning: the whole model
    if lora.enabled:  # the adapter, and beside it the merged model when asked for
        exported = plan.params_trainable + (plan.params_total if lora.merge_on_export else 0)
    sizes = {"checkpoints": plan.checkpoint_bytes * (cfg.train.save_total_limit + 1),
             "export": exported * EXPORT_BYTES_PER_PARAM if cfg.run.export_dir else 0,
             "cache": data.tokens * CACHE_BYTES_PER_TOKEN if data else 0}
    return run_writes(launch.run_dir, cfg.run.checkpoint_dir, cfg.run.export_dir, cfg.data.cache_dir, sizes)


def refuse_unless_room(report: LaunchPlan, force: bool) -> None:
    """Exit 2 (ConfigError) naming the file system, bytes needed and free, when the run cannot fit there."""
    if not force:
        require_room(report.disk)


def refuse_unless_fits(report: LaunchPlan, force: bool) -> None:
    """Exit 2 (ConfigError) with one line naming the best suggestions when the plan does not fit,
    or the partition's limit the job breaks (whatever --force says: such a job would pend forever)."""
    plan = report.plan
    if report.cluster and report.cluster.problems:
        raise ConfigError(f"{report.cluster.problems[0]}; the job would pend forever")
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
    from launcher.commands.launch_args import build_parser, request_from_args
    from launcher.resolve.options import resolve

    parser = build_parser(launch=False)
    parser.prog = "sft-launch plan"
    parser.description = ("Plan a launch (memory per GPU, verdict, time, cost, signal lead, the partition's "
                          f"limits); writes nothing. Exit 0: fits; {EXIT_DOES_NOT_FIT}: does not fit; "
                          "2: bad flags or configuration.")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (for tools)")
    args = parser.parse_args(argv)
    launch = resolve(request_from_args(args))
    from launcher.resolve.preflight import check_launch

    check_launch(launch)
    report = plan_launch(launch)
    print(report.to_json() if args.json else report.text)
    return 0 if report.fits else EXIT_DOES_NOT_FIT
