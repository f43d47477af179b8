"""Cluster profiles: the `[profiles.NAME]` tables of cluster.toml, validated into `ClusterProfile`.

Pure stdlib (tomllib). Semantic errors get the TOML line of the offending key, which tomllib does
not report itself: we look the key up in the file text (see `line_of_key`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract import gpus
from contract.schema import ConfigError, build, closest, read_utf8, require
from contract.strategies import Strategy
from launcher.resolve.sbatch_options import sbatch_option, validate_profile_options

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Credential-looking env names: a last word TOKEN/KEY (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, PRIVATE_KEY), or
# SECRET/PASSWORD/PASSWD/API_KEY/ACCESS_KEY anywhere (AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID, DB_PASSWORD_FILE).
# Whole words only for TOKEN/KEY, so TOKENIZERS_PARALLELISM or a KEYS_DIR are not mistaken for secrets.
_SECRET_NAME = re.compile(r"(^|_)(TOKEN|KEY)$|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY", re.IGNORECASE)
# `NAME=` assignments inside a shell setup line (export X=..., env X=... cmd, X=... cmd).
_SHELL_ASSIGNMENT = re.compile(r"(?<![\w$-])([A-Za-z_][A-Za-z0-9_]*)=")
_TIME_FORMATS = (
    re.compile(r"^(?P<d>\d+)-(?P<h>\d{1,2})(:(?P<m>\d{1,2})(:(?P<s>\d{1,2}))?)?$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d{1,2}):(?P<s>\d{1,2})$"),
    re.compile(r"^(?P<m>\d+)(:(?P<s>\d{1,2}))?$"),
)

# `--executor local` without a cluster file: one CPU host, FSDP2 over gloo (see ARCHITECTURE.md).
EMBEDDED_LOCAL_PROFILE: dict[str, Any] = {
    "gpus_per_node": 0,
    "processes_per_node": 2,
    "backend": "gloo",
    "storage_root": "./runs",
    "time": "1:00:00",
}
EMBEDDED_LOCAL_NAME = "local"


def is_secret_name(name: str) -> bool:
    """Env var names that look like credentials; they must never be written into a rendered file."""
    return bool(_SECRET_NAME.search(name))


def parse_time_limit(text: str) -> int:
    """SLURM time limit ('D-HH:MM:SS', 'HH:MM:SS', 'MM', 'D-HH', ...) -> seconds; ValueError if malformed."""
    for pattern in _TIME_FORMATS:
        match = pattern.match(text.strip())
        if match:
            parts = {k: int(v) if v else 0 for k, v in match.groupdict(default="0").items()}
            seconds = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts["m"] * 60 + parts["s"]
            if seconds > 0:
                return seconds
    raise ValueError(f"bad time limit {text!r}: use D-HH:MM:SS, HH:MM:SS or minutes")


def format_time_limit(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


@dataclass
class ContainerSection:
    kind: Literal["none", "pyxis", "apptainer"] = "none"
    image: str = ""  # pyxis: image ref or .sqsh path; apptainer: .sif path
    mounts: list[str] = field(default_factory=list)  # "SRC:DST" (pyxis --container-mounts / apptainer --bind)

    def validate(self) -> None:
        require(self.kind == "none" or bool(self.image), "container.image", f"required when kind = '{self.kind}'")
        for mount in self.mounts:
            require("," not in mount, "container.mounts", f"one mount per entry, got {mount!r}")


@dataclass
class ClusterProfile:
    # sbatch_option(default, flag[, submitit parameter]): the key is also `#SBATCH --flag` (launcher/resolve/sbatch_options.py).
    partition: str = sbatch_option("", "partition", "partition")
    account: str = sbatch_option("", "account", "account")
    qos: str = sbatch_option("", "qos", "qos")
    reservation: str = sbatch_option("", "reservation")
    constraint: str = sbatch_option("", "constraint", "constraint")
    exclusive: bool = sbatch_option(True, "exclusive", "exclusive")
    gpus_per_node: int = sbatch_option(8, "gpus-per-node", "gpus_per_node")
    gpu_type: str = ""  # key of contract.gpus.GPUS; drives peak FLOP/s, memory, flash-attn checks
    processes_per_node: int = 0  # 0 = gpus_per_node; required (>= 1) when gpus_per_node = 0
    cpus_per_task: int = sbatch_option(0, "cpus-per-task", "cpus_per_task")  # 0 = leave to SLURM
    mem: str = sbatch_option("", "mem")  # per node, e.g. "0" (all), "480G"; "" = leave to SLURM
    time: str = "1-00:00:00"  # default time limit; --time overrides
    strategy: Strategy = "fsdp"  # default sharding strategy; --strategy overrides
    cpu_offload: bool = False  # offload params (FSDP) / optimizer+params (ZeRO-3) to CPU
    backend: Literal["nccl", "gloo"] = "nccl"
    setup: list[str] = field(default_factory=list)  # shell lines run first (module load, venv activation)
    env: dict[str, str] = field(default_factory=dict)  # exported before training (NCCL_*, FI_PROVIDER, ...)
    container: ContainerSection = field(default_factory=ContainerSection)
    storage_root: str = "./runs"  # run directories go here (shared filesystem on a cluster)
    hf_home: str = ""  # exported as HF_HOME when set (shared HF cache)
    shared_paths: list[str] = field(default_factory=list)  # prefixes every node sees; [] = not checked
    signal_lead_s: int = 300  # SLURM sends USR1 this long before the time limit
    # Write bandwidth of the shared storage available to one job (GB/s): the planner sizes the signal
    # lead a checkpoint save needs from it. 2 GB/s is a conservative parallel-filesystem figure.
    storage_write_gbps: float = 2.0
    # NCCL bus bandwidth between nodes, GB/s per GPU (nccl-tests' busbw of a large all-gather across the job's nodes):
    # the planner's time for FSDP's inter-node collectives. 0 = the GPU type's DGX-class figure (one NIC per GPU).
    network_gbps: float = 0.0
    # Node-local storage (NVMe) where an asynchronous save is staged when a node's RAM cannot hold its ranks'
    # shards (train.async_save_staging); $VARS are expanded on the node; "" = $SLURM_TMPDIR, else /tmp.
    node_local_dir: str = ""
    max_timeouts: int = 3  # stop requeueing after this many time-limit hits (preemptions are not capped)
    rdzv_timeout_s: int = 900  # how long nodes wait for each other at startup
    # A dead or hung node (#15): a rank with no completed step for max(hang_timeout_s, a multiple of the
    # measured step time) stops the job; a collective waits at most collective_timeout_s. The batch
    # shell then excludes the node it blames and requeues, at most max_node_failures times.
    hang_timeout_s: int = 600
    collective_timeout_s: int = 600
    max_node_failures: int = 2
    master_port: int = 0  # 0 = 20000 + job_id % 10000 (outside the ephemeral range)
    python: str = "python3"  # used by the batch shell for run.json and the checkpointed-after-stop check
    sbatch: dict[str, str | int | bool] = field(default_factory=dict)  # other sbatch options: {mail-type = "END"}

    @property
    def procs_per_node(self) -> int:
        return self.processes_per_node or self.gpus_per_node

    @property
    def time_limit_s(self) -> int:
        return parse_time_limit(self.time)

    @property
    def unset_in_job(self) -> list[str]:
        """What a job must not inherit from the submitting shell: with hf_home set, HF_DATASETS_CACHE (unless
        `env` sets it), which would override it: `plan` reads <hf_home>/datasets, and so must the run on every
        executor (contract/readers.py's hub_datasets_cache)."""
        return ["HF_DATASETS_CACHE"] if self.hf_home and "HF_DATASETS_CACHE" not in self.env else []

    def job_env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` plus what the job script exports (`env`, HF_HOME = hf_home), less `unset_in_job`, for runs
        started here."""
        env = {**base, **self.env}
        if self.hf_home:
            env["HF_HOME"] = self.hf_home
        for name in self.unset_in_job:
            env.pop(name, None)
        return env

    def validate(self) -> None:
        self._validate_resources()
        validate_profile_options(self)
        try:
            limit = parse_time_limit(self.time)
        except ValueError as err:
            raise ConfigError(f"time: {err}", "time") from None
        require(0 < self.signal_lead_s < limit, "signal_lead_s", f"must be > 0 and below the time limit ({limit} s)")
        require(self.storage_write_gbps > 0, "storage_write_gbps", "must be > 0")
        require(self.network_gbps >= 0, "network_gbps", "must be >= 0 (0 = the GPU type's typical figure)")
        require(self.max_timeouts >= 0, "max_timeouts", "must be >= 0")
        require(self.rdzv_timeout_s >= 1, "rdzv_timeout_s", "must be >= 1")
        require(self.hang_timeout_s >= 0, "hang_timeout_s", "must be >= 0 (0 = no progress watchdog)")
        require(self.collective_timeout_s >= 1, "collective_timeout_s", "must be >= 1")
        require(self.max_node_failures >= 0, "max_node_failures", "must be >= 0")
        require(self.master_port == 0 or 1024 < self.master_port < 65536, "master_port", "must be 0 or 1025-65535")
        require(bool(self.python.strip()), "python", "must name the interpreter the batch shell runs (python3)")
        require(bool(self.storage_root.strip()), "storage_root", "must name the folder run directories go to")
        for name in self.env:
            require(bool(_ENV_NAME.match(name)), f"env.{name}", "not a valid environment variable name")
            require(not is_secret_name(name), f"env.{name}",
                    "looks like a secret; export it in your shell instead (sbatch passes the environment on)")
        for line in self.setup:
            secret = next((n for n in _SHELL_ASSIGNMENT.findall(line) if is_secret_name(n)), None)
            require(secret is None, "setup", f"a setup line sets {secret}, which looks like a secret; "
                    "export it in your shell instead")

    def _validate_resources(self) -> None:
        require(self.gpus_per_node >= 0, "gpus_per_node", "must be >= 0")
        require(self.processes_per_node >= 0, "processes_per_node", "must be >= 0")
        require(self.cpus_per_task >= 0, "cpus_per_task", "must be >= 0")
        if self.gpus_per_node == 0:
            require(self.processes_per_node >= 1, "processes_per_node", "must be >= 1 on a CPU profile (gpus_per_node = 0)")
            require(self.backend == "gloo", "backend", "a CPU profile (gpus_per_node = 0) needs 'gloo'")
        else:
            require(self.processes_per_node in (0, self.gpus_per_node), "processes_per_node",
                    "must be 0 or equal gpus_per_node on a GPU profile (one process per GPU)")
        if self.gpu_type:
            require(gpus.lookup(self.gpu_type) is not None, "gpu_type",
                    f"unknown GPU '{self.gpu_type}'{closest(self.gpu_type, gpus.GPUS)}; known: {', '.join(gpus.GPUS)}")


@dataclass
class ClusterFile:
    """A parsed cluster.toml: raw profile tables plus the text (for line numbers)."""

    path: Path
    text: str
    default_profile: str
    profiles: dict[str, dict[str, Any]]


def read_cluster_file(path: Path) -> ClusterFile:
    try:
        text = read_utf8(path)
        data = tomllib.loads(text)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: {err}") from None
    unknown = set(data) - {"default_profile", "profiles"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{path}:{line_of_key(text, [], key)}: unknown top-level key '{key}'; "
                          "valid: default_profile, profiles")
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict) or not profiles:
        raise ConfigError(f"{path}: no [profiles.NAME] table; see cluster.example.toml")
    default = data.get("default_profile", next(iter(profiles)))
    return ClusterFile(path, text, str(default), profiles)


def line_of_key(text: str, table: list[str], dotted_key: str) -> int:
    """1-based line where `dotted_key` is set inside table `table` (e.g. ['profiles', 'gpu']); best effort.

    Handles `[a.b]` headers with `key = ...` lines, sub-tables (`[a.b.container]` + `image =`) and
    dotted keys (`container.image =`). Falls back to the table's header line (a top-level key given as a
    table, `[profile.gpu]`: that header), then to 1.
    """
    lines = text.splitlines()
    parts = dotted_key.split(".")
    header_line = 0
    for split in range(len(parts) - 1, -1, -1):
        header = ".".join(table + parts[:split])
        key_rest = ".".join(parts[split:])
        start = _find_header(lines, header) if header else 0
        if start is None:
            continue
        header_line = header_line or start
        key_pattern = re.compile(rf"^\s*{re.escape(key_rest)}\s*=".replace(r"\.", r"\s*\.\s*"))
        for index in range(start, len(lines)):
            if index > start and lines[index].lstrip().startswith("[") and header:
                break
            if key_pattern.match(lines[index]):
                return index + 1
    if not table and not header_line:  # a top-level key set as a table: [key.sub] or [[key]]
        table_header = re.compile(rf"^\s*\[\[?\s*{re.escape(parts[0])}\s*[.\]]")
        header_line = next((index + 1 for index, line in enumerate(lines) if table_header.match(line)), 0)
    return header_line or 1


def _find_header(lines: list[str], header: str) -> int | None:
    """0-based index of the line *after* `[header]`, or None."""
    pattern = re.compile(rf"^\s*\[\s*{re.escape(header)}\s*\]".replace(r"\.", r"\s*\.\s*"))
    for index, line in enumerate(lines):
        if pattern.match(line):
            return index + 1
    return None


def select_profile(cluster: ClusterFile | None, name: str | None) -> tuple[str, dict[str, Any]]:
    """(profile name, raw table) from the file, or the embedded local profile when there is no file."""
    if cluster is None:
        if name not in (None, EMBEDDED_LOCAL_NAME):
            raise ConfigError(f"--profile {name}: no cluster file, only the embedded '{EMBEDDED_LOCAL_NAME}' profile")
        return EMBEDDED_LOCAL_NAME, dict(EMBEDDED_LOCAL_PROFILE)
    name = name or cluster.default_profile
    if name not in cluster.profiles:
        raise ConfigError(f"--profile {name}: not in {cluster.path}{closest(name, cluster.profiles)}; "
                          f"profiles: {', '.join(cluster.profiles)}")
    raw = cluster.profiles[name]
    if not isinstance(raw, dict):
        raise ConfigError(f"{cluster.path}: profiles.{name} must be a table")
    return name, raw


def build_profile(raw: dict[str, Any], name: str, cluster: ClusterFile | None, cli_keys: set[str]) -> ClusterProfile:
    """Validate a raw profile. Errors name the TOML line, or the --set flag when the key came from the CLI."""
    try:
        return build(ClusterProfile, raw)
    except ConfigError as err:
        key = err.key or ""
        if key in cli_keys or key.split(".")[0] in cli_keys or cluster is None:
            raise ConfigError(f"--set profile: {err}", key) from None
        line = line_of_key(cluster.text, ["profiles", name], key)
        raise ConfigError(f"{cluster.path}:{line}: [profiles.{name}] {err}", key) from None
