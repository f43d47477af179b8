"""contract.blame: which node the batch shell excludes after a failed attempt, and when it must not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from contract import blame
from contract.blame import NO_NODE, Evidence, decide

HOSTS = {0: "node1", 1: "node2", 2: "node2"}


def record(rank: int, message: str, exit_code: int = 1, **extra: object) -> dict:
    return {"time": 100.0 + rank, "rank": rank, "host": HOSTS[rank], "exit_code": exit_code, "follow_on": False,
            "message": message, **extra}


PEER_LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Read error [10.99.0.12]:41234: Connection reset by peer"


def test_slurm_node_state_wins() -> None:
    evidence = Evidence(node_states={"node1": "mixed", "node2": "down*"}, hosts=HOSTS)
    assert decide(evidence) == ("node2", "SLURM reports node2 down*")
    assert decide(Evidence(node_states={"node1": "mixed*"}))[0] == "node1"  # `*`: not responding
    assert decide(Evidence(node_states={"node1": "drained"}))[0] == "node1"
    # ... over the ranks' lost-peer records, but never over a rank's own error (a data bug on rank 0
    # while node2 is drained for maintenance is the data bug).
    lost_peer = Evidence(node_states={"node2": "draining"}, failures=[record(0, PEER_LOST, 76)], hosts=HOSTS)
    assert decide(lost_peer)[0] == "node2"
    data_bug = Evidence(node_states={"node1": "mixed", "node2": "draining"},
                        failures=[record(0, "ValueError: data.jsonl:7: no 'messages'")], hosts=HOSTS)
    node, reason = decide(data_bug)
    assert node == NO_NODE and "rank 0 recorded an error of its own" in reason


def test_an_own_error_is_never_a_node_even_if_peers_died_silently() -> None:
    evidence = Evidence(failures=[record(0, "ValueError: bad row")], hosts=HOSTS)
    node, reason = decide(evidence)
    assert node == NO_NODE and "rank 0 recorded an error of its own" in reason
    everyone = Evidence(failures=[record(r, "KeyError: 'x'") for r in HOSTS], hosts=HOSTS)
    assert decide(everyone)[0] == NO_NODE


def test_watchdog_record_names_the_silent_ranks() -> None:
    hang = {"waited_s": 30, "last_step": 7, "silent_ranks": [1, 2]}
    evidence = Evidence(failures=[record(0, "no progress for 30 s", 76, hang=hang)], hosts=HOSTS)
    node, reason = decide(evidence)
    assert node == "node2" and "ranks 1,2 on node2" in reason


def test_watchdog_ranks_on_two_hosts_blame_nobody() -> None:
    hang = {"silent_ranks": [0, 1]}
    evidence = Evidence(failures=[record(2, "no progress", 76, hang=hang)], hosts=HOSTS)
    node, reason = decide(evidence)
    assert node == NO_NODE and "do not map to one host" in reason


def test_rank_without_record_while_others_lost_a_peer() -> None:
    evidence = Evidence(failures=[record(0, PEER_LOST)], hosts={0: "node1", 1: "node2"})
    node, reason = decide(evidence)
    assert node == "node2" and "rank 1 on node2 died without a failure record" in reason


def test_stale_heartbeat() -> None:
    evidence = Evidence(hosts={0: "node1", 1: "node2"}, beats={0: 1000.0, 1: 970.0})
    assert decide(evidence)[0] == "node2"
    close = Evidence(hosts={0: "node1", 1: "node2"}, beats={0: 1000.0, 1: 995.0})
    assert decide(close)[0] == NO_NODE


def test_no_evidence_no_blame() -> None:
    node, reason = decide(Evidence(node_states={"node1": "mixed", "node2": "allocated"}, hosts=HOSTS))
    assert node == NO_NODE and reason.startswith("no evidence")


def _write(run_dir: Path, name: str, lines: list[dict]) -> None:
    path = run_dir / "logs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_cli_reads_this_attempts_evidence_only(tmp_path: Path) -> None:
    roster = [{"time": 50.0, "rank": 1, "host": "node3", "pid": 1, "job": "7", "restart": 0},  # earlier attempt
              {"time": 101.0, "rank": 0, "host": "node1", "pid": 2, "job": "7", "restart": 1},
              {"time": 101.0, "rank": 1, "host": "node2", "pid": 3, "job": "7", "restart": 1}]
    _write(tmp_path, "ranks.jsonl", roster)
    _write(tmp_path, "failures.jsonl", [{**record(0, PEER_LOST), "time": 120.0},
                                        {**record(1, "ValueError: old attempt"), "time": 60.0}])
    env_free = {"PATH": "/nonexistent", "PYTHONPATH": str(Path(blame.__file__).parents[1])}  # no SLURM here
    out = subprocess.run([sys.executable, "-m", "contract.blame", str(tmp_path), "100"], capture_output=True,
                         text=True, env=env_free, check=True).stdout
    assert out.startswith("node2 rank 1 on node2 died without a failure record"), out
