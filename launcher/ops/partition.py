"""Login-node checks against the cluster itself, when SLURM answers: the job must fit the profile's
partition. sbatch accepts a job that asks for more nodes than the partition has or allows, or more time
than its MaxTime, and it then pends forever (PartitionNodeLimit, PartitionTimeLimit); a GPU profile
on a partition without GPUs never starts either. So the plan (and every launch) asks
`scontrol show partition -o` (MaxNodes, MaxTime, TotalNodes, GraceTime) and `sinfo -o %G` (the nodes'
GRES), once per plan: the plan's GraceTime warning reads the same answer.

Where SLURM cannot be asked (no client here, no controller, the local executor), nothing is checked
and the plan says so; an unknown partition name is left to sbatch (which names it).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field

from launcher.ops import slurm
from launcher.resolve.options import Launch
from launcher.resolve.profile import format_time_limit, parse_time_limit

_GPU_GRES = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass
class Partition:
    name: str
    total_nodes: int
    max_nodes: int | None  # None = UNLIMITED
    max_time_s: int | None  # None = UNLIMITED / INFINITE
    gpus_per_node: int  # most GPUs (GRES gpu) any node of the partition has; 0 = none
    grace_time_s: int | None = None  # GraceTime: how long a preempted job may save; None = not said


@dataclass
class ClusterCheck:
    line: str  # the plan's "Cluster" line
    problems: list[str] = field(default_factory=list)  # each a reason the job can never start there
    grace_time_s: int | None = None  # the partition's GraceTime, where SLURM told it


def _limit(value: str) -> int | None:
    return None if value in ("UNLIMITED", "INFINITE", "") else int(value)


def _time(value: str) -> int | None:
    return None if value in ("UNLIMITED", "INFINITE", "") else parse_time_limit(value)


def _gpus(gres_lines: str) -> int:
    """Most GPUs per node in `sinfo -o %G` output ('gpu:a100:8(S:0-1),shard:4' or '(null)')."""
    most = 0
    for line in gres_lines.splitlines():
        for item in line.split(","):
            match = _GPU_GRES.match(item.strip())
            if match:
                most = max(most, int(match[1]))
    return most


def parse_partition(scontrol_line: str, gres_lines: str) -> Partition:
    """A Partition from one line of `scontrol show partition -o` and `sinfo -h -p NAME -o %G`."""
    fields = dict(slurm.parse_fields(scontrol_line))
    return Partition(name=fields.get("PartitionName", ""), total_nodes=int(fields.get("TotalNodes", "0")),
                     max_nodes=_limit(fields.get("MaxNodes", "UNLIMITED")),
                     max_time_s=_time(fields.get("MaxTime", "UNLIMITED")), gpus_per_node=_gpus(gres_lines),
                     grace_time_s=int(grace) if (grace := fields.get("GraceTime", "")).isdigit() else None)


def read_partition(name: str) -> Partition | None:
    """The partition `name` ("" = the cluster's default one); None when SLURM does not know it.
    slurm.SlurmUnavailable when SLURM cannot be asked."""
    if shutil.which("scontrol") is None or shutil.which("sinfo") is None:
        raise slurm.SlurmUnavailable("no SLURM client here")
    proc = slurm.run(["scontrol", "show", "partition", "-o", *([name] if name else [])])
    if proc.returncode != 0:
        if "not found" in proc.stderr.lower() or "invalid partition" in proc.stderr.lower():
            return None
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        raise slurm.SlurmUnavailable(said[-1].strip() if said else f"scontrol exit {proc.returncode}")
    lines = proc.stdout.splitlines()
    line = next((x for x in lines if not name and "Default=YES" in x), lines[0] if lines else "")
    if not line.strip():
        return None
    found = slurm.parse_fields(line).get("PartitionName", name)
    gres = slurm.run(["sinfo", "-h", "-p", found, "-o", "%G"])
    return parse_partition(line, gres.stdout if gres.returncode == 0 else "")


def problems(launch: Launch, part: Partition) -> list[str]:
    """Why the job can never start in `part` (empty: it can)."""
    found = []
    where = f"partition {part.name}"
    if launch.nodes > part.total_nodes:
        found.append(f"--nodes {launch.nodes}: {where} has {part.total_nodes} node(s)")
    elif part.max_nodes is not None and launch.nodes > part.max_nodes:
        found.append(f"--nodes {launch.nodes}: {where} allows at most {part.max_nodes} node(s) per job (MaxNodes)")
    if part.max_time_s is not None and launch.time_limit_s > part.max_time_s:
        found.append(f"--time {launch.time_limit}: {where} allows at most {format_time_limit(part.max_time_s)} "
                     "(MaxTime; set --time or profile.time)")
    gpus = launch.profile.gpus_per_node
    if gpus and part.gpus_per_node < gpus:
        has = f"{part.gpus_per_node} GPU(s) per node" if part.gpus_per_node else "no GPUs (GRES gpu)"
        found.append(f"profile.gpus_per_node = {gpus}: {where} has {has}")
    return found


def check_cluster(launch: Launch) -> ClusterCheck | None:
    """The job against its partition, from one `scontrol show partition` (the plan reads its GraceTime
    from here too); None for the local executor (no SLURM involved)."""
    if launch.executor == "local":
        return None
    name = launch.profile.partition
    try:
        part = read_partition(name)
    except slurm.SlurmUnavailable as err:
        return ClusterCheck(f"not checked: SLURM not reachable from here ({err})")
    if part is None:
        return ClusterCheck(f"not checked: SLURM knows no partition {name!r} (sbatch will refuse it)")
    limits = (f"partition {part.name}: {part.total_nodes} node(s), MaxNodes {part.max_nodes or 'UNLIMITED'}, "
              f"MaxTime {format_time_limit(part.max_time_s) if part.max_time_s else 'UNLIMITED'}, "
              f"{part.gpus_per_node or 'no'} GPU(s) per node")
    found = problems(launch, part)
    return ClusterCheck(f"{limits}: {'DOES NOT FIT' if found else 'fits'}", found, part.grace_time_s)
