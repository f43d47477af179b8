"""sbatch options defined once: a `ClusterProfile` field made with `sbatch_option` is both a profile
key and an `#SBATCH --flag=value` line in launch.slurm (and the matching submitit parameter). A
profile's `sbatch = {KEY = VALUE}` passes any other option through both executors, validated like
the rest (a literal token: sbatch never expands #SBATCH lines).

To add a profile key for an sbatch option: one `sbatch_option(...)` field in launcher/resolve/profile.py and
its line in cluster.example.toml.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from contract.schema import require

# Values that end up on `#SBATCH` lines must be literal tokens: sbatch never expands or unquotes them.
SBATCH_TOKEN = re.compile(r"^[A-Za-z0-9_.,:|&!*=+@/\[\]%-]*$")
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
_NOT_LITERAL = "has characters sbatch cannot take literally"
# Set by sft-launch itself from the launch (job name, size, time) or the requeue protocol.
OWNED_FLAGS = frozenset({"job-name", "nodes", "ntasks-per-node", "time", "output", "error", "open-mode", "signal",
                         "requeue", "no-requeue", "chdir"})


@dataclasses.dataclass(frozen=True)
class ProfileOption:
    key: str  # ClusterProfile field; 0 / "" / false = leave to SLURM
    flag: str  # sbatch long option; a true bool is the bare flag
    submitit: str = ""  # submitit SlurmExecutor parameter; "" = through additional_parameters


def sbatch_option(default: Any, flag: str, submitit: str = "") -> Any:
    """A profile field that is also the sbatch option `--flag` (submitit: that parameter, else
    additional_parameters)."""
    return dataclasses.field(default=default, metadata={"sbatch": flag, "submitit": submitit})


def profile_options(profile: Any) -> list[ProfileOption]:
    """The profile's sbatch options, in field order."""
    return [ProfileOption(f.name, f.metadata["sbatch"], f.metadata["submitit"])
            for f in dataclasses.fields(profile) if "sbatch" in f.metadata]


def validate_profile_options(profile: Any) -> None:
    """Every value that reaches an #SBATCH line is a literal token; pass-through names are new options."""
    options = profile_options(profile)
    for option in options:
        value = getattr(profile, option.key)
        if isinstance(value, str):
            require(bool(SBATCH_TOKEN.match(value)), option.key, f"{value!r} {_NOT_LITERAL}")
    table = {option.flag: option.key for option in options}
    for name, value in profile.sbatch.items():
        key = f"sbatch.{name}"
        require(bool(_OPTION_NAME.match(name)), key, "an sbatch long option name without dashes, e.g. mail-type")
        require(name not in table, key, f"use the profile key '{table.get(name)}' instead")
        require(name not in OWNED_FLAGS, key, "set by sft-launch itself")
        require(value is not False, key, "false: leave the option out instead")
        require(bool(SBATCH_TOKEN.match(str(value))), key, f"{value!r} {_NOT_LITERAL}")


def profile_sbatch_options(profile: Any) -> list[tuple[str, Any]]:
    """(flag, value) of the profile's options, field order then pass-through; value True = bare flag."""
    options = [(o.flag, getattr(profile, o.key)) for o in profile_options(profile) if getattr(profile, o.key)]
    return options + list(profile.sbatch.items())


def sbatch_line(flag: str, value: Any) -> str:
    return f"#SBATCH --{flag}" if value is True else f"#SBATCH --{flag}={value}"


def submitit_parameters(profile: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(SlurmExecutor parameters, additional_parameters) for the profile's options."""
    set_options = [o for o in profile_options(profile) if getattr(profile, o.key)]
    named = {o.submitit: getattr(profile, o.key) for o in set_options if o.submitit}
    extra = {o.flag: getattr(profile, o.key) for o in set_options if not o.submitit}
    return named, {**extra, **profile.sbatch}
