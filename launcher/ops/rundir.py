"""What a run directory holds, read-only: run.json, train.toml settings, metrics, checkpoints, logs.

A RUN argument is a run directory path, or a run name under the profile's storage root
(`--cluster FILE --profile NAME`, default ./cluster.toml's default profile, else ./runs).
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import protocol
from contract.protocol import CHECKPOINT_MARKER, is_run_dir
from contract.schema import ConfigError
from launcher import runrecord
from launcher.usage import given

_LOG_NAME = re.compile(r"^(?P<job>[0-9_]+)-r(?P<restart>\d+)\.log$")  # protocol.log_name


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=given, metavar="RUN", help="run directory, or a run name under the storage root")
    add_root_arguments(parser)


def add_root_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=given, metavar="FILE", help="cluster profiles (default ./cluster.toml)")
    parser.add_argument("--profile", type=given, metavar="NAME", help="profile whose storage_root holds the runs")
    parser.add_argument("--root", type=given, metavar="DIR", help="storage root to look in (instead of the profile's)")


def storage_root(args: argparse.Namespace) -> Path:
    """--root, else the profile's storage_root (embedded local profile when there is no cluster file)."""
    from launcher.resolve.profile import EMBEDDED_LOCAL_PROFILE, read_cluster_file, select_profile

    if args.root:
        return Path(args.root).expanduser()
    cluster_path = Path(args.cluster) if args.cluster else Path("cluster.toml")
    if not args.cluster and not cluster_path.is_file():
        return Path(str(EMBEDDED_LOCAL_PROFILE["storage_root"]))
    cluster = read_cluster_file(cluster_path)  # ConfigError (exit 2) names the file
    _, raw = select_profile(cluster, args.profile)
    return Path(str(raw.get("storage_root", "./runs"))).expanduser()


def resolve_run(args: argparse.Namespace) -> Path:
    """RUN as a path, else as a name under the storage root; ConfigError (exit 2) names it when unknown."""
    given = Path(args.run).expanduser()
    if is_run_dir(given):
        return given.resolve()
    root = storage_root(args)
    if "/" not in args.run and is_run_dir(root / args.run):
        return (root / args.run).resolve()
    raise ConfigError(f"RUN {args.run}: no run directory (no run.json or train.toml) at {given} "
                      f"or under the storage root {root}")


def read_run_json(run_dir: Path) -> dict[str, Any]:
    try:
        return runrecord.read(run_dir / protocol.RUN_RECORD)
    except json.JSONDecodeError as err:
        raise RuntimeError(f"{run_dir / 'run.json'}:{err.lineno}: not valid JSON ({err.msg})") from None


def train_settings(run_dir: Path) -> dict[str, Any]:
    """train.toml as a plain dict (unvalidated: status must work even if the schema moved on)."""
    try:
        return tomllib.loads((run_dir / protocol.TRAIN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def run_path(run_dir: Path, settings: dict[str, Any], key: str, default: str) -> Path:
    """A [run] path setting (checkpoint_dir, metrics_file, stop_file) resolved against the run dir."""
    rel = Path(str(settings.get("run", {}).get(key, default)))
    return rel if rel.is_absolute() else run_dir / rel


def export_dir(run_dir: Path) -> Path:
    """The run's exported model (train.toml run.export_dir): a full model or a LoRA adapter
    (protocol.is_exported_model); ConfigError when training has not exported."""
    path = run_path(run_dir, train_settings(run_dir), "export_dir", "export")
    if not protocol.is_exported_model(path):
        raise ConfigError(f"RUN {run_dir}: no exported model at {path} (has training finished?)")
    return path


def read_metrics(run_dir: Path, settings: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every record of metrics.jsonl; a line still being written (incomplete JSON) is skipped."""
    path = run_path(run_dir, settings if settings is not None else train_settings(run_dir), "metrics_file",
                    protocol.METRICS_FILE)
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Training-step records only (not eval or the final 'done')."""
    return [r for r in records if "loss" in r and "step" in r and r.get("event") is None]


def complete_checkpoints(run_dir: Path, settings: dict[str, Any] | None = None) -> list[tuple[int, Path]]:
    """(step, dir) of every checkpoint that holds the COMPLETE marker, oldest first."""
    root = run_path(run_dir, settings if settings is not None else train_settings(run_dir), "checkpoint_dir",
                    protocol.CHECKPOINT_DIR)
    found = []
    for marker in root.glob(f"{protocol.CHECKPOINT_PREFIX}*/{CHECKPOINT_MARKER}"):
        step = protocol.checkpoint_step(marker.parent)
        if step is not None:
            found.append((step, marker.parent))
    return sorted(found)


@dataclass(frozen=True)
class LogFile:
    job_id: str
    restart: int
    path: Path


def log_files(run_dir: Path, job_ids: list[str] | None = None) -> list[LogFile]:
    """logs/<jobid>-r<restart>.log, oldest first: by the job's order in run.json, then restart."""
    order = {job: index for index, job in enumerate(job_ids or [])}
    files = []
    for path in (run_dir / protocol.LOGS_DIR).glob("*-r*.log"):
        match = _LOG_NAME.match(path.name)
        if match:
            files.append(LogFile(match["job"], int(match["restart"]), path))

    def key(log: LogFile) -> tuple[int, int, int, float]:
        job = log.job_id.split("_")[0]
        return (order.get(log.job_id, len(order)), int(job) if job.isdigit() else 0, log.restart,
                log.path.stat().st_mtime)

    return sorted(files, key=key)


def local_log(run_dir: Path) -> LogFile | None:
    """A local run's log (it has no SLURM job, so no per-restart log): rank 0's output of its newest attempt,
    what its terminal showed."""
    ranks = run_dir / protocol.LOGS_DIR / protocol.RANK_LOGS_DIR
    attempts = sorted(ranks.glob(f"{protocol.LOCAL_ATTEMPT_PREFIX}*/"), key=lambda path: path.stat().st_mtime)
    path = attempts[-1] / protocol.rank_log_name(0) if attempts else None
    return LogFile(attempts[-1].name, 0, path) if path is not None and path.is_file() else None


def total_steps(settings: dict[str, Any], records: list[dict[str, Any]]) -> int | None:
    """train.max_steps when set, else the `total_steps` of the newest metrics record that has one."""
    max_steps = int(settings.get("train", {}).get("max_steps", -1) or -1)
    if max_steps > 0:
        return max_steps
    totals = [r["total_steps"] for r in records if isinstance(r.get("total_steps"), int)]
    return totals[-1] if totals else None


def procs_per_node(run: dict[str, Any]) -> int:
    """Training processes per node, from the profile recorded in run.json (1 when unknown)."""
    profile = run.get("profile", {})
    return int(profile.get("processes_per_node") or profile.get("gpus_per_node") or 1)


def executor(run: dict[str, Any]) -> str:
    submissions = run.get("submissions") or [{}]
    return str(submissions[-1].get("executor", "sbatch"))
