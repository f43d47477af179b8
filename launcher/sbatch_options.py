"""sbatch options from one table: profile key -> `#SBATCH --flag=value` in launch.slurm and the
matching submitit parameter. A profile's `sbatch = {KEY = VALUE}` passes any other option through
both executors, validated like the rest (a literal token: sbatch never expands #SBATCH lines).

To add a profile key for an sbatch option: a field in `ClusterProfile` (launcher/profile.py), a row
here, a line in cluster.example.toml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from contract.schema import require

# Values that end up on `#SBATCH` lines must be literal tokens: sbatch never expands or unquotes them.
SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:|&!*=+@/\[\]%-]*$")
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class ProfileOption:
    key: str  # ClusterProfile field; 0 / "" / false = leave to SLURM
    flag: str  # sbatch long option; a true bool is the bare flag
    submitit: str = ""  # submitit SlurmExecutor parameter; "" = through additional_parameters


PROFILE_OPTIONS: tuple[ProfileOption, ...] = (
    ProfileOption("gpus_per_node", "gpus-per-node", "gpus_per_node"),
    ProfileOption("cpus_per_task", "cpus-per-task", "cpus_per_task"),
    ProfileOption("mem", "mem"),
    ProfileOption("partition", "partition", "partition"),
    ProfileOption("account", "account", "account"),
    ProfileOption("qos", "qos", "qos"),
    ProfileOption("reservation", "reservation"),
    ProfileOption("constraint", "constraint", "constraint"),
    ProfileOption("exclusive", "exclusive", "exclusive"),
)
# Set by sft-launch itself from the launch (job name, size, time) or the requeue protocol.
OWNED_FLAGS = frozenset({"job-name", "nodes", "ntasks-per-node", "time", "output", "error", "open-mode", "signal",
                         "requeue", "no-requeue", "chdir"})


def validate_profile_options(profile: Any) -> None:
    """Every value that reaches an #SBATCH line is a literal token; pass-through names are new options."""
    for option in PROFILE_OPTIONS:
        value = getattr(profile, option.key)
        if isinstance(value, str):
            require(bool(SBATCH_TOKEN.match(value)), option.key, f"{value!r} has characters sbatch cannot take literally")
    table = {option.flag: option.key for option in PROFILE_OPTIONS}
    for name, value in profile.sbatch.items():
        key = f"sbatch.{name}"
        require(bool(_OPTION_NAME.match(name)), key, "an sbatch long option name without dashes, e.g. mail-type")
        require(name not in table, key, f"use the profile key '{table.get(name)}' instead")
        require(name not in OWNED_FLAGS, key, "set by sft-launch itself")
        require(value is not False, key, "false: leave the option out instead")
        require(bool(SBATCH_TOKEN.match(str(value))), key, f"{value!r} has characters sbatch cannot take literally")


def profile_sbatch_options(profile: Any) -> list[tuple[str, Any]]:
    """(flag, value) of the profile's options, table order then pass-through; value True = bare flag."""
    options = [(o.flag, getattr(profile, o.key)) for o in PROFILE_OPTIONS if getattr(profile, o.key)]
    return options + list(profile.sbatch.items())


def sbatch_line(flag: str, value: Any) -> str:
    return f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={value}"


def submitit_parameters(profile: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SlurmExecutor parameters, additional_parameters) for the profile's options."""
    named = {o.submitit: getattr(profile, o.key) for o in PROFILE_OPTIONS if o.submitit and getattr(profile, o.key)}
    extra = {o.flag: getattr(profile, o.key) for o in PROFILE_OPTIONS if not o.submitit and getattr(profile, o.key)}
    return named, {**extra, **profile.sbatch}
