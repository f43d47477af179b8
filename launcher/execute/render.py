"""Launch -> run directory: render the Jinja templates, then write the files (and run.json).

`render_files` is pure (no filesystem writes), so template errors surface before any directory
exists. jinja2 and tomli_w are imported lazily: `sft-launch --help` must stay instant.
"""

from __future__ import annotations

import importlib.resources
import json
import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from contract import __version__, protocol
from contract.command import node_shell, train_command
from contract.schema import to_dict
from contract.strategies import ZERO_MAX_LIVE_PARAMETERS, ZERO_SUB_GROUP_SIZE, zero_reduce_bucket_size
from launcher import runrecord
from launcher.resolve.options import Launch
from launcher.resolve.profile import ClusterProfile
from launcher.resolve.sbatch_options import profile_sbatch_options, sbatch_line

TEMPLATE_NAMES = {
    protocol.LAUNCH_SCRIPT: "launch.slurm.j2",
    protocol.ACCELERATE_CONFIG: "accelerate.yaml.j2",
    protocol.DEEPSPEED_CONFIG: "deepspeed.json.j2",
    protocol.TRAIN_CONFIG: "train.toml.j2",
}
ALWAYS_RENDERED = (protocol.LAUNCH_SCRIPT, protocol.TRAIN_CONFIG)  # the strategy names the others
PACKAGE_DIR = Path(str(importlib.resources.files("launcher"))).resolve()  # wherever this module sits in it


def template_dir() -> Path:
    """Installed wheel: launcher/templates/; source checkout: the repo's templates/."""
    for candidate in (PACKAGE_DIR / "templates", PACKAGE_DIR.parent / "templates"):
        if (candidate / "launch.slurm.j2").is_file():
            return candidate
    raise FileNotFoundError("sft-launch templates not found (broken install?)")


def _yaml_string(value: Any) -> str:
    # A JSON string literal is a valid YAML double-quoted scalar: safe for any path.
    return json.dumps(str(value))


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["yamlstr"] = _yaml_string
    return env


SLURM_SIGNAL_EARLY_S = 60  # sbatch(1) --signal: "may be sent up to 60 seconds earlier than specified"


def timeout_threshold_s(limit_s: int, signal_lead_s: int = 0) -> int:
    """A stop signal after this much run time is the time limit, not a preemption.

    min(0.8 x limit, limit - 10 min); for limits of 10 min or less that second term is <= 0 (every
    signal would count as a time-limit hit), so 0.8 x limit alone. Given the profile's signal lead,
    never later than the moment the time-limit signal can arrive (limit - lead - 60 s), or the real
    time-limit signal would pass for a preemption; at least 1 s.
    """
    threshold = min(int(0.8 * limit_s), limit_s - 600) if limit_s > 600 else int(0.8 * limit_s)
    if signal_lead_s:
        threshold = min(threshold, limit_s - signal_lead_s - SLURM_SIGNAL_EARLY_S)
    return max(1, threshold)


def node_command() -> str:
    """The training command as launch.slurm runs it on every node: `bash -c '...' _ "$RUN_DIR/..." ...`
    passes the values as positional arguments, which each node expands itself. The run directory is
    that of $6 (RUN_DIR/train.toml): the node's working directory may be a container's."""
    attempt = protocol.attempt_name("$SLURM_JOB_ID", "${SLURM_RESTART_COUNT:-0}")
    argv = train_command('$1', '$6', num_machines="$SLURM_NNODES", machine_rank="$SLURM_NODEID", num_processes="$2",
                         main_ip="$3", main_port="$4", rdzv_timeout_s="$5", attempt=attempt)
    text = node_shell(argv, protocol.rank_logs_dir("${6%/*}", attempt), "$HOSTNAME")
    for flag in ("exec", "--num_machines", "--main_process_ip", "-m", "2>>"):  # continuation lines, for the reader
        text = text.replace(f" {flag}", f" \\\n    {flag}", 1)
    return text


def profile_view(profile: ClusterProfile) -> dict[str, Any]:
    """The profile as the job templates read it (`p`): its keys and what they derive from them."""
    return {**to_dict(profile), "procs_per_node": profile.procs_per_node, "unset_in_job": profile.unset_in_job}


def context(launch: Launch) -> dict[str, Any]:
    view = profile_view(launch.profile)
    # The trained arch (a --set model.arch.hidden_size=... override included), not the preset's.
    hidden = int(launch.train.model.arch.get("hidden_size") or launch.preset.arch["hidden_size"])
    return {
        "version": __version__,
        "profile_name": launch.profile_name,
        "p": view,
        "container": view["container"],
        "job_name": launch.job_name,
        "nodes": launch.nodes,
        "world_size": launch.world_size,
        "strategy": launch.strategy,
        "time_limit": launch.time_limit,
        "time_limit_s": launch.time_limit_s,
        "timeout_after_s": timeout_threshold_s(launch.time_limit_s, launch.profile.signal_lead_s),
        "run_dir": str(launch.run_dir),
        "stop_path": str(launch.run_dir / launch.train.run.stop_file),
        "checkpoint_path": str(launch.run_dir / launch.train.run.checkpoint_dir),
        "deepspeed_path": str(launch.run_dir / protocol.DEEPSPEED_CONFIG),
        "exit_requeue": protocol.EXIT_REQUEUE,
        "cancel_file": protocol.CANCEL_FILE,
        "node_failures_file": f"{protocol.LOGS_DIR}/{protocol.NODE_FAILURES_FILE}",
        "attempt_file": f"{protocol.LOGS_DIR}/{protocol.ATTEMPT_FILE}",
        "job_start_env": protocol.JOB_START_ENV,
        "batch_failures_file": f"{protocol.LOGS_DIR}/{protocol.BATCH_FAILURES_FILE}",
        "helpers_dir": protocol.BATCH_HELPERS_DIR,
        "srun_log": '"' + protocol.rank_logs_dir("$RUN_DIR", protocol.attempt_name("${SLURM_JOB_ID}", "${RESTART}"))
        + "/" + protocol.SRUN_LOG + '"',
        "files": {"accelerate": protocol.ACCELERATE_CONFIG, "train": protocol.TRAIN_CONFIG,
                  "run": protocol.RUN_RECORD, "logs": protocol.LOGS_DIR},
        "master_port": {"base": protocol.MASTER_PORT_BASE, "span": protocol.MASTER_PORT_SPAN},
        "sbatch_lines": [sbatch_line(flag, value) for flag, value in profile_sbatch_options(launch.profile)],
        "node_command": node_command(),
        "s": launch.strategy_spec,
        "layer_class": launch.train.model.layer_class,
        "hidden": hidden,
        "mixed_precision": launch.mixed_precision,
        "zero_max_live_parameters": ZERO_MAX_LIVE_PARAMETERS,
        "zero_sub_group_size": ZERO_SUB_GROUP_SIZE,
        "zero_reduce_bucket_size": zero_reduce_bucket_size(hidden),
        "train": launch.train.train,
    }


def render_files(launch: Launch) -> dict[str, str]:
    """{file name: content} for the run directory; deepspeed.json only for zero2/zero3."""
    import tomli_w

    env = _environment()
    ctx = context(launch)
    ctx["body"] = tomli_w.dumps(to_dict(launch.train))
    chosen = launch.micro_batch
    ctx["micro_batch_note"] = chosen.describe() if chosen and chosen.source == "auto" else ""
    names = [n for n in TEMPLATE_NAMES if n in ALWAYS_RENDERED or n in launch.strategy_spec.config_files]
    return {name: env.get_template(TEMPLATE_NAMES[name]).render(ctx) for name in names}


def git_sha() -> str | None:
    """Commit of the sft-launch checkout this code runs from (None for an installed wheel)."""
    root = PACKAGE_DIR.parent
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# What the batch shell runs with `python -m` (stdlib only), copied into the run directory with their packages.
BATCH_HELPER_MODULES = ("contract.protocol", "contract.liveness", "contract.failure", "contract.blame",
                        "launcher.runrecord")


def write_batch_helpers(run_dir: Path) -> None:
    """RUN/.batch-helpers/: the modules the batch shell runs, as this sft-launch has them, so that the
    compute node's python needs only its standard library (contract.protocol.BATCH_HELPERS_DIR)."""
    import importlib

    sources: dict[Path, str] = {}  # each file once (the packages' __init__.py are shared by several modules)
    for name in BATCH_HELPER_MODULES:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            relative = Path(*parts[:depth], "__init__.py") if depth < len(parts) else Path(*parts).with_suffix(".py")
            sources.setdefault(relative, str(importlib.import_module(".".join(parts[:depth])).__file__))
    target = run_dir / protocol.BATCH_HELPERS_DIR
    for relative, source in sources.items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        _write(target / relative, Path(source).read_text(encoding="utf-8"))


def write_files(directory: Path, files: dict[str, str]) -> None:
    """The rendered files, and the batch shell's helpers, into `directory` (a run directory, or a dry
    run's temporary one)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / protocol.LOGS_DIR).mkdir(exist_ok=True)
    for name, text in files.items():
        _write(directory / name, text)
    (directory / protocol.LAUNCH_SCRIPT).chmod(0o755)
    write_batch_helpers(directory)


def record_fields(launch: Launch) -> dict[str, Any]:
    """What run.json says about the launch (refreshed at every launch into the directory)."""
    return {
        "sft_launch_version": __version__,
        "git_sha": git_sha(),
        "cluster_file": launch.cluster_file,
        "profile_name": launch.profile_name,
        "profile": to_dict(launch.profile),
        "model": launch.preset.name,
        "nodes": launch.nodes,
        "strategy": launch.strategy,
        "world_size": launch.world_size,
        "time_limit": launch.time_limit,
        "python": sys.executable,
        # launcher/plan/autofit.py: the micro-batch chosen for the user and why (None: the user fixed it)
        "micro_batch": launch.micro_batch.record() if launch.micro_batch else None,
        # launcher/resolve/max_length.py: what model_max_length = "auto" resolved to (None: the length was a number)
        "model_max_length_auto": launch.auto_length.record() if launch.auto_length else None,
        # launcher/resolve/datarules.py: eval rows also trained, allowed by data.allow_eval_overlap (None: none)
        "eval_overlap": asdict(launch.eval_overlap) if launch.eval_overlap else None,
    }


def write_run_dir(launch: Launch, command: list[str]) -> Path:
    """Render, then create/refresh the run directory. An existing one (a resume) keeps its history."""
    files = render_files(launch)
    run_dir = launch.run_dir
    write_files(run_dir, files)
    for stale in set(TEMPLATE_NAMES) - set(files):
        (run_dir / stale).unlink(missing_ok=True)  # e.g. deepspeed.json left over from an earlier zero run
    (run_dir / protocol.CANCEL_FILE).unlink(missing_ok=True)  # launching again means: this run should go on
    submission = {
        "time": runrecord.now(),
        "command": command,
        "cwd": str(Path.cwd()),
        "executor": launch.executor,
    }
    fields = record_fields(launch)

    def change(data: dict[str, Any]) -> None:
        data.update(fields)
        data.setdefault("job_ids", [])
        data.setdefault("submissions", []).append(submission)
        data.setdefault("events", [])

    runrecord.update(run_dir / protocol.RUN_RECORD, change)
    return run_dir


def record_submission(run_dir: Path, job_id: str) -> None:
    """After sbatch: remember the job id on the latest submission and in job_ids."""

    def change(data: dict[str, Any]) -> None:
        runrecord.add_job_id(data, job_id)
        if data.get("submissions"):
            data["submissions"][-1]["job_id"] = job_id

    runrecord.update(run_dir / protocol.RUN_RECORD, change)
