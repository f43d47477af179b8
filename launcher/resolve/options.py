"""CLI request -> validated `Launch`: cluster profile + model preset + train.toml config + run directory.

Precedence (later wins): TrainConfig defaults < model preset defaults < dedicated CLI flags
(--data, --lora, training flags) < `--set`. Everything is validated here, before anything is written.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract import gpus
from contract.config import TrainConfig, TrainSection
from contract.parallel import context_blocker, expert_blocker, expert_sharding_blocker
from contract.schema import ConfigError, build, field_type, parse_for, set_dotted, to_dict
from contract.shape import EXPERT_LORA_TARGETS, ModelShape
from contract.strategies import CPU_STRATEGIES, LAUNCHABLE, STRATEGIES, StrategySpec
from launcher.plan.autofit import MAX_LENGTH_KEY, MicroBatchChoice, fit_micro_batch
from launcher.resolve.plan_input import plan_input_from_launch
from launcher.resolve.data_args import absolute_paths, at_line, data_table, data_toml
from launcher.resolve.max_length import AutoLength, resolve_auto_length
from launcher.resolve.presets import Preset, resolve_model
from launcher.resolve.profile import (
    ClusterFile, ClusterProfile, build_profile, format_time_limit, parse_time_limit, read_cluster_file,
    select_profile,
)

if TYPE_CHECKING:
    from contract.datacheck import DataCheck
    from contract.overlap import Overlap

TRAIN_NAMESPACES = ("model", "data", "train", "lora", "parallel", "run")
DEFAULT_CLUSTER_FILE = "cluster.toml"


@dataclass
class LaunchRequest:
    """What the user asked for, straight from the command line."""

    model: str
    nodes: int = 1
    cluster: str | None = None
    profile: str | None = None
    data: str | list[str] | None = None  # --data, repeatable (launcher/resolve/data_args.py)
    output: str | None = None
    strategy: str | None = None
    lora: bool = False
    qlora: bool = False  # --qlora: LoRA over an NF4-quantized base (lora.quant = "nf4")
    context_parallel: int | None = None  # --context_parallel N: parallel.context (each sequence over N GPUs)
    expert_parallel: int | None = None  # --expert_parallel N: parallel.expert (each MoE layer's experts over N GPUs)
    time: str | None = None
    job_name: str | None = None
    executor: str = "sbatch"
    dry_run: bool = False
    sets: list[str] = field(default_factory=list)
    train_flags: dict[str, Any] = field(default_factory=dict)  # TrainSection field -> raw value


@dataclass
class Launch:
    """A fully validated launch: everything the templates and executors need."""

    profile_name: str
    profile: ClusterProfile
    preset: Preset
    train: TrainConfig
    nodes: int
    strategy: str
    time_limit_s: int
    run_dir: Path
    job_name: str
    executor: str
    cluster_file: str | None
    micro_batch: MicroBatchChoice | None = None  # launcher/plan/autofit.py's choice; None = the user fixed it
    data_checks: list[DataCheck] = field(default_factory=list)  # launcher/resolve/preflight.py's verdicts on the data
    data_file: Path | None = None  # `--data FILE.toml`: its errors are named FILE:LINE (data_args.at_line)
    auto_length: AutoLength | None = None  # what model_max_length = "auto" resolved to (launcher/resolve/max_length.py)
    eval_overlap: Overlap | None = None  # eval rows that are training rows, allowed by data.allow_eval_overlap

    @property
    def world_size(self) -> int:
        return self.nodes * self.profile.procs_per_node

    @property
    def global_batch(self) -> int:
        t = self.train.train
        return t.per_device_train_batch_size * t.gradient_accumulation_steps * self.world_size

    @property
    def time_limit(self) -> str:
        return format_time_limit(self.time_limit_s)

    @property
    def strategy_spec(self) -> StrategySpec:
        return STRATEGIES[self.strategy]

    @property
    def mixed_precision(self) -> str:
        """'bf16' / 'fp16' / 'no' for Accelerate and DeepSpeed, from model.precision and the profile's GPU."""
        spec = gpus.lookup(self.profile.gpu_type)
        return gpus.mixed_precision(self.train.model.precision, self.profile.gpus_per_node > 0,
                                    spec.has_bf16 if spec is not None else None)


def train_flag_names() -> list[str]:
    """Training flags generated from TrainSection (one source of truth with train.toml)."""
    return [f.name for f in dataclasses.fields(TrainSection)]


def _split_sets(sets: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """--set KEY=VALUE list -> (profile overrides, train.toml overrides) as dotted-key dicts."""
    profile_sets: dict[str, Any] = {}
    train_sets: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item}: expected KEY=VALUE")
        namespace, _, rest = key.partition(".")
        if namespace == "profile" and rest:
            profile_sets[rest] = parse_for(value, field_type(ClusterProfile, rest))
        elif namespace in TRAIN_NAMESPACES and rest:
            train_sets[key] = parse_for(value, field_type(TrainConfig, key))
        else:
            raise ConfigError(f"--set {key}: unknown key; use profile.<key> or "
                              f"{', '.join(n + '.<key>' for n in TRAIN_NAMESPACES)}")
    return profile_sets, train_sets


def _load_cluster(request: LaunchRequest) -> ClusterFile | None:
    if request.cluster:
        return read_cluster_file(Path(request.cluster))
    default = Path(DEFAULT_CLUSTER_FILE)
    if default.is_file():
        return read_cluster_file(default)
    if request.executor == "local":
        return None  # the embedded CPU profile
    raise ConfigError(f"no ./{DEFAULT_CLUSTER_FILE}: copy cluster.example.toml to ./{DEFAULT_CLUSTER_FILE} "
                      "and edit it, or pass --cluster FILE (or use --executor local)")


def resolve_profile(request: LaunchRequest, profile_sets: dict[str, Any]) -> tuple[str, ClusterProfile, ClusterFile | None]:
    cluster = _load_cluster(request)
    name, raw = select_profile(cluster, request.profile)
    raw = copy.deepcopy(raw)
    for key, value in profile_sets.items():
        set_dotted(raw, key, value)
    cli_keys = set(profile_sets) | {k.split(".")[0] for k in profile_sets}
    return name, build_profile(raw, name, cluster, cli_keys), cluster


def build_train_config(request: LaunchRequest, preset: Preset, profile: ClusterProfile,
                       train_sets: dict[str, Any]) -> TrainConfig:
    data: dict[str, Any] = {
        "model": {"name": preset.name, "path": preset.hf_id, "layer_class": preset.layer_class},
        "train": dict(preset.train_defaults),
        "lora": ({"enabled": True} if request.lora or request.qlora else {})
                | ({"quant": "nf4"} if request.qlora else {}),
        "parallel": {key: value for key, value in (("context", request.context_parallel),
                                                   ("expert", request.expert_parallel)) if value is not None},
        # run.dir "." = the folder holding train.toml, so the run directory stays relocatable.
        "run": {"dir": ".", "gpu_type": profile.gpu_type, "hang_timeout_s": profile.hang_timeout_s,
                "collective_timeout_s": profile.collective_timeout_s, "node_local_dir": profile.node_local_dir},
    }
    if not preset.hf_id:
        data["model"]["arch"] = dict(preset.arch)
    flags = [request.data] if isinstance(request.data, str) else list(request.data or [])
    if flags:
        data["data"] = data_table(flags)
    for name, value in request.train_flags.items():
        data["train"][name] = value
    for key, value in train_sets.items():
        set_dotted(data, key, value)
    if any(key.startswith("data.") for key in train_sets):
        absolute_paths(data["data"], Path.cwd())  # --set data.sources=[{path = "a.jsonl"}] as --data would
    try:
        return build(TrainConfig, data)
    except ConfigError as err:
        toml = data_toml(flags)
        from_file = (err.key or "").startswith("data.") and not any(key.startswith("data.") for key in train_sets)
        raise (at_line(err, toml) if toml and from_file else err) from None


def _safe_name(text: str) -> str:
    """Job / directory names: keep [A-Za-z0-9._-], replace the rest (sbatch lines cannot quote)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.") or "run"


# Profile keys left out of the run directory's name: the same training with a longer time limit is
# the same run, resumed (`--time` is left out too).
UNHASHED_PROFILE_KEYS = ("time",)


def config_hash(profile_name: str, profile: ClusterProfile, train: TrainConfig, nodes: int, strategy: str) -> str:
    """Short hash of everything that changes the job, for the default run dir: the profile's resolved
    contents (not only its name: another cluster file's profile of the same name is another run), the
    training config, nodes and strategy. Not the time limit."""
    resolved = {k: v for k, v in to_dict(profile).items() if k not in UNHASHED_PROFILE_KEYS}
    shape = {"profile": profile_name, "profile_contents": resolved, "procs": profile.procs_per_node,
             "nodes": nodes, "strategy": strategy, "train": to_dict(train)}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:8]


def check_attention(backend: str, gpus_per_node: int, spec: gpus.GpuSpec | None) -> None:
    """A GPU-only attention backend on a CPU profile or a GPU its kernels do not support."""
    if backend not in gpus.ATTENTION_MIN_CAPABILITY:
        return
    if gpus_per_node == 0:
        raise ConfigError(f"model.attn_implementation: {backend} needs GPUs (profile has gpus_per_node = 0)")
    low = gpus.ATTENTION_MIN_CAPABILITY[backend]
    if spec is not None and spec.compute_capability < low:
        major, minor = spec.compute_capability
        raise ConfigError(f"model.attn_implementation: {backend} needs compute capability >= {low[0]}.{low[1]}; "
                          f"{spec.name} has {major}.{minor}")


def check_quantized_base(launch: Launch) -> None:
    """QLoRA (lora.quant) runs under FSDP2 only, with the NF4 weights on the GPUs (train/engine/qlora.py)."""
    quant = launch.train.lora.quant
    if quant == "none":
        return
    if launch.strategy != "fsdp":
        raise ConfigError(f"--qlora: lora.quant = {quant!r} needs --strategy fsdp (FSDP2 shards torchao's NF4 "
                          f"weights), not {launch.strategy}")
    if launch.profile.cpu_offload:
        raise ConfigError(f"profile.cpu_offload: not with lora.quant = {quant!r} (--qlora): FSDP2 would move the "
                          "NF4 weights to the host and back as new trainable parameters; the 4-bit base is the saving")
    arch = launch.train.model.arch or launch.preset.arch
    blocker = ModelShape.from_arch(arch).nf4_blocker(list(launch.train.lora.target_modules), launch.world_size) \
        if arch else None
    if blocker:  # the rule train/engine/qlora.py applies on the nodes, before the queue
        raise ConfigError(f"--qlora: model {launch.preset.name}'s {blocker} (NF4 blocks per rank); use --lora, "
                          "or a model or rank count whose linears split", "lora.quant")


def check_sharded_init(launch: Launch) -> None:
    """model.init = "sharded" (train/engine/sharded_init.py): FSDP2 shards the meta model before each rank draws
    its part; DeepSpeed and FSDP1 would need the whole model on some rank first."""
    strategy = launch.strategy_spec
    if launch.train.model.init == "sharded" and (strategy.engine == "deepspeed" or strategy.fsdp_version == 1):
        raise ConfigError(f"model.init: 'sharded' needs --strategy fsdp (FSDP2 shards the model on the meta device "
                          f"before each rank draws its part), not {launch.strategy}", "model.init")


def check_fp8(launch: Launch, spec: gpus.GpuSpec | None) -> None:
    """train.precision = "fp8": FP8 GPUs only, FSDP2 (or one GPU) only (train/kernels/float8.py)."""
    if launch.train.train.precision != "fp8":
        return
    capability = spec.compute_capability if spec else None
    blocker = gpus.fp8_blocker(launch.profile.gpus_per_node > 0, capability)
    if blocker:
        raise ConfigError(f"--precision fp8: cannot be used: {blocker}", "train.precision")
    strategy = launch.strategy_spec
    if strategy.engine != "fsdp" or strategy.fsdp_version == 1:
        raise ConfigError(f"--precision fp8: needs --strategy fsdp (FSDP2 shards torchao's float8 linears), "
                          f"not {launch.strategy}", "train.precision")


def check_context_parallel(launch: Launch) -> None:
    """parallel.context (train/kernels/context_parallel.py): N divides the ranks and the model's heads (Ulysses
    sends each rank whole heads), under FSDP2 or DDP, whose gradient average over every rank it relies on."""
    context = launch.train.parallel.context
    if context == 1:
        return
    flag = f"--context_parallel {context}"
    strategy = launch.strategy_spec
    if strategy.engine == "deepspeed" or strategy.fsdp_version == 1:
        raise ConfigError(f"{flag}: needs --strategy fsdp (FSDP2) or ddp, not {launch.strategy}", "parallel.context")
    arch = launch.train.model.arch or launch.preset.arch
    shape = ModelShape.from_arch(arch) if arch else None
    blocker = context_blocker(context, launch.world_size, shape.heads if shape else None,
                              shape.kv_heads if shape else None)
    if blocker:
        raise ConfigError(f"{flag}: {blocker}", "parallel.context")


def check_expert_parallel(launch: Launch) -> None:
    """parallel.expert (train/moe/expert_parallel.py): N divides the model's experts and the ranks, under FSDP2's
    full shard without CPU offload (its dim-0 shards of the fused expert tensors are what each rank computes)."""
    expert, flag = launch.train.parallel.expert, f"--expert_parallel {launch.train.parallel.expert}"
    if expert == 1:
        return
    spec = launch.strategy_spec
    if blocker := expert_sharding_blocker(launch.strategy, spec.fsdp_version == 2 and spec.shards == "world",
                                          launch.profile.cpu_offload):
        raise ConfigError(f"{flag}: {blocker}", "parallel.expert")
    arch = launch.train.model.arch or launch.preset.arch
    if blocker := expert_blocker(expert, launch.world_size, ModelShape.from_arch(arch).experts, arch.get("model_type")):
        raise ConfigError(f"{flag}: {blocker}", "parallel.expert")
    if launch.train.lora.enabled and set(launch.train.lora.target_modules) & set(EXPERT_LORA_TARGETS):
        raise ConfigError(f"{flag}: LoRA on the experts or the router is not supported with it yet", "lora.target_modules")


def check_combinations(launch: Launch) -> None:
    """Impossible combinations, each as one line naming the flag or key."""
    profile, model = launch.profile, launch.train.model
    spec = gpus.lookup(profile.gpu_type)
    if profile.gpus_per_node == 0 and launch.strategy_spec.gpu_only:
        raise ConfigError(f"--strategy {launch.strategy}: {launch.strategy_spec.gpu_only}; "
                          f"CPU profiles (gpus_per_node = 0) support only {', '.join(CPU_STRATEGIES)} (FSDP2 over gloo)")
    if profile.cpu_offload and launch.strategy_spec.no_cpu_offload:
        raise ConfigError(f"profile.cpu_offload: {launch.strategy_spec.no_cpu_offload}")
    check_attention(model.attn_implementation, profile.gpus_per_node, spec)
    check_quantized_base(launch)
    check_fp8(launch, spec)
    check_sharded_init(launch)
    check_context_parallel(launch)
    check_expert_parallel(launch)
    if launch.train.train.fused_mlp is True:
        blocker = gpus.fused_mlp_blocker(profile.gpus_per_node > 0, spec.compute_capability if spec else None,
                                         launch.train.lora.enabled, launch.strategy_spec.zero_stage)
        if blocker:
            raise ConfigError(f"train.fused_mlp: cannot be used: {blocker}")
    if model.precision == "bf16" and spec is not None and not spec.has_bf16:
        raise ConfigError(f"model.precision: {spec.name} has no bf16; use fp16 or auto")
    if launch.executor == "local" and launch.nodes != 1:
        raise ConfigError("--nodes: the local executor runs on this machine only (use --nodes 1)")
    if launch.profile.signal_lead_s >= launch.time_limit_s:
        raise ConfigError(f"--time {launch.time_limit}: shorter than the profile's signal_lead_s "
                          f"({launch.profile.signal_lead_s} s)")


def _user_set(request: LaunchRequest, key: str) -> bool:
    """Did the user fix this dotted key (a training flag or --set)?"""
    section, name = key.split(".")
    if section == "train" and name in request.train_flags:
        return True
    if key == "parallel.context" and request.context_parallel is not None:  # --context_parallel N
        return True
    if key == "parallel.expert" and request.expert_parallel is not None:  # --expert_parallel N
        return True
    return any(item.partition("=")[0].strip() == key for item in request.sets)


def _fit_micro_batch(launch: Launch, request: LaunchRequest) -> MicroBatchChoice | None:
    """launcher/plan/autofit.py's choice for this launch, applied to its train.toml config."""
    inp = plan_input_from_launch(launch)
    auto = launch.auto_length

    def user_set(key: str) -> bool:  # "auto" raised past the default by the data: keep those documents whole
        return auto.raised if key == MAX_LENGTH_KEY and auto is not None else _user_set(request, key)

    choice = fit_micro_batch(inp, launch.train.train.model_max_length, user_set)
    if choice is not None:
        if choice.tokens != inp.micro_batch_tokens:
            launch.train.data.tokens_per_micro_batch = choice.tokens
        launch.train.train.gradient_checkpointing = choice.checkpointing
        launch.train.train.checkpoint_layers = choice.checkpoint_layers
        launch.train.train.activation_offload = choice.activation_offload
        launch.train.parallel.context = choice.context_parallel
    return choice


def resolve(request: LaunchRequest) -> Launch:
    """Validate everything and decide the run directory; raises ConfigError (exit 2) on bad input."""
    if request.nodes < 1:
        raise ConfigError(f"--nodes {request.nodes}: must be >= 1")
    profile_sets, train_sets = _split_sets(request.sets)
    profile_name, profile, cluster = resolve_profile(request, profile_sets)
    preset = resolve_model(request.model)
    train = build_train_config(request, preset, profile, train_sets)
    strategy = request.strategy or profile.strategy
    if strategy not in LAUNCHABLE:
        raise ConfigError(f"--strategy {strategy}: must be one of {', '.join(LAUNCHABLE)}")
    try:
        time_limit_s = parse_time_limit(request.time) if request.time else profile.time_limit_s
    except ValueError as err:
        raise ConfigError(f"--time: {err}") from None
    launch = Launch(profile_name, profile, preset, train, request.nodes, strategy, time_limit_s, Path(),
                    "", request.executor, str(cluster.path) if cluster else None)
    launch.data_file = data_toml([request.data] if isinstance(request.data, str) else list(request.data or []))
    launch.auto_length = resolve_auto_length(launch)  # before anything reads model_max_length
    check_combinations(launch)
    # Before the run-directory hash: a different micro-batch is a different run, never resumed as this one.
    launch.micro_batch = _fit_micro_batch(launch, request)
    digest = config_hash(profile_name, profile, train, request.nodes, strategy)
    if request.output:
        launch.run_dir = Path(request.output).expanduser().resolve()
    else:
        # Deterministic: the same command lands in the same directory, so re-running it resumes.
        launch.run_dir = (Path(profile.storage_root).expanduser()
                          / _safe_name(f"{profile_name}-{preset.name}-{digest}")).resolve()
    train.run.name = train.run.name or launch.run_dir.name
    launch.job_name = _safe_name(request.job_name or f"sft-{launch.run_dir.name}")
    return launch
