"""Which node to blame for a failed attempt: the batch shell's question before it requeues without it (#15).

Torch-free and stdlib-only: the batch shell runs `python -m contract.blame RUN_DIR SINCE` on a compute
node after srun ended badly (SINCE = the attempt's start, epoch seconds). It prints one line:

    node2 <reason>        exclude node2 and requeue
    - <reason>            no node to blame: the job ends with its usual failure line (contract.failure)

Evidence, strongest first (only this attempt's: records written since SINCE):
1. A rank recorded an error of its own (not a hang, not a lost peer): a code or data bug, never a node,
   even when the other ranks died before they could record anything, and even when SLURM drains a node
   of the job at the same time (maintenance would otherwise take the blame for a data bug).
2. SLURM's own word: a node of the job that is down, not responding, drained or failing.
3. Progress-watchdog / collective-timeout records (exit 76) naming the silent ranks.
4. A rank of the roster that died without a failure record while other ranks recorded a lost peer
   (a connection error, a timeout): its process or node vanished.
5. A rank whose last heartbeat is far older than the others': it froze while they waited.
Ranks map to hosts through the roster. Ranks of more than one host is no answer: excluding healthy
nodes would shrink the cluster for nothing, and a real node failure recurs with clearer evidence.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import failure, liveness, protocol

NO_NODE = "-"
# `sinfo -N -o "%N %T"` states (lower case, a trailing `*` = not responding) that make a node suspect.
BAD_STATES = ("down", "drain", "fail", "not_responding", "no_respond", "power_down", "unknown")
# Words of the errors a rank raises when a peer vanished (gloo/NCCL/c10d), as opposed to its own bug.
PEER_ERROR_WORDS = ("connection", "peer", "broken pipe", "timed out", "timeout", "socket", "gloo", "nccl",
                    "distbackenderror", "distnetworkerror")
HEARTBEAT_GAP_S = liveness.SILENT_AFTER_S  # missed beats: frozen or dead, not a slow file system
SLURM_QUERY_TIMEOUT_S = 15


@dataclass
class Evidence:
    """What the decision reads; `decide` is pure so the rules are tested without SLURM or files."""

    node_states: dict[str, str] = field(default_factory=dict)  # host -> SLURM state, the job's nodes
    failures: list[dict[str, Any]] = field(default_factory=list)  # this attempt's failure records
    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host (roster of this attempt)
    beats: dict[int, float] = field(default_factory=dict)  # rank -> time of its last heartbeat


def suspect_state(state: str) -> bool:
    state = state.lower()
    return state.endswith("*") or any(word in state for word in BAD_STATES)


def _one_host(ranks: list[int], hosts: dict[int, str]) -> str | None:
    named = {hosts[rank] for rank in ranks if rank in hosts}
    return named.pop() if len(named) == 1 and len(ranks) == sum(rank in hosts for rank in ranks) else None


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in sorted(ranks))


def hung_ranks(records: list[dict[str, Any]]) -> list[int]:
    """Ranks that watchdog / collective-timeout records (exit 76) name as silent."""
    ranks: set[int] = set()
    for record in records:
        hang = record.get("hang") if record.get("exit_code") == protocol.EXIT_HUNG else None
        silent = hang.get("silent_ranks") if isinstance(hang, dict) else None
        ranks.update(r for r in silent or [] if isinstance(r, int))
    return sorted(ranks)


def stale_ranks(beats: dict[int, float], gap_s: float = HEARTBEAT_GAP_S) -> list[int]:
    """Ranks whose last heartbeat is more than `gap_s` older than the newest one (all ranks are gone
    by the time the batch shell asks, so the newest beat, not the clock, is the reference)."""
    if len(beats) < 2:
        return []
    newest = max(beats.values())
    return sorted(rank for rank, beat in beats.items() if newest - beat > gap_s)


def own_errors(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of errors a rank raised itself: neither a hang (76), nor a follow-on, nor a lost peer."""
    return [r for r in records if not r.get("follow_on") and r.get("exit_code") != protocol.EXIT_HUNG
            and not any(word in str(r.get("message", "")).lower() for word in PEER_ERROR_WORDS)]


def decide(evidence: Evidence) -> tuple[str, str]:
    """(node or NO_NODE, reason), by the rules of the module docstring, first match wins."""
    own = own_errors(evidence.failures)
    if own:
        ranks = sorted({r.get("rank") for r in own if isinstance(r.get("rank"), int)})
        errors = "an error of its own" if len(ranks) == 1 else "errors of their own"
        return NO_NODE, f"{_ranks_text(ranks)} recorded {errors} (a code or data problem, not a node)"
    for host, state in sorted(evidence.node_states.items()):
        if suspect_state(state):
            return host, f"SLURM reports {host} {state}"
    recorded = {r.get("rank") for r in evidence.failures}
    candidates = [
        (hung_ranks(evidence.failures), "stopped making progress (watchdog/collective timeout)"),
        ([r for r in evidence.hosts if r not in recorded] if recorded else [],
         "died without a failure record while the other ranks lost a peer"),
        (stale_ranks(evidence.beats), f"stopped its heartbeat more than {HEARTBEAT_GAP_S:.0f} s before the others"),
    ]
    for ranks, why in candidates:
        if not ranks:
            continue
        host = _one_host(ranks, evidence.hosts)
        if host:
            return host, f"{_ranks_text(ranks)} on {host} {why}"
        return NO_NODE, f"{_ranks_text(ranks)} {why}, but they do not map to one host"
    return NO_NODE, "no evidence against a node (no SLURM node fault, no silent rank)"


# ---------------------------------------------------------------- reading the evidence
def roster_hosts(run_dir: Path, since: float) -> dict[int, str]:
    """rank -> host of this attempt's roster lines (a rank's newest line wins)."""
    return {r["rank"]: str(r.get("host")) for r in liveness.read_roster(run_dir)
            if isinstance(r.get("rank"), int) and float(r.get("time", 0)) >= since - failure.CLOCK_SLACK_S}


def heartbeat_times(run_dir: Path, since: float) -> dict[int, float]:
    """rank -> when this attempt's ranks last wrote their heartbeat."""
    return {rank: float(beat["time"]) for rank, beat in liveness.read_heartbeats(run_dir).items()
            if beat["time"] >= since}


def _run(*cmd: str) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""  # no SLURM here (a container), or a controller that does not answer: other evidence decides
    return proc.stdout if proc.returncode == 0 else ""


def slurm_node_states(nodes: set[str]) -> dict[str, str]:
    """host -> SLURM state (`sinfo -N -o '%N %T'`, e.g. `mixed*`, `down*`, `drained`) of the given nodes."""
    if not nodes:
        return {}
    states: dict[str, str] = {}
    for line in _run("sinfo", "-h", "-N", "-n", ",".join(sorted(nodes)), "-o", "%N %T").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in nodes:
            states[parts[0]] = parts[1]
    return states


def job_nodes() -> set[str]:
    """The nodes of the job this runs in ($SLURM_JOB_NODELIST expanded), empty outside a job."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    return set(_run("scontrol", "show", "hostnames", nodelist).split()) if nodelist else set()


def gather(run_dir: Path, since: float) -> Evidence:
    hosts = roster_hosts(run_dir, since)
    failures = [r for r in failure.read_failures(run_dir) if r["time"] >= since - failure.CLOCK_SLACK_S]
    return Evidence(node_states=slurm_node_states(job_nodes() | set(hosts.values())), failures=failures,
                    hosts=hosts, beats=heartbeat_times(run_dir, since))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m contract.blame RUN_DIR SINCE", file=sys.stderr)
        return protocol.EXIT_USAGE
    node, reason = decide(gather(Path(argv[0]), float(argv[1])))
    print(f"{node} {reason}")
    return protocol.EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
