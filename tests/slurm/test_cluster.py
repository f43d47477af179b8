"""Smoke tests of the local cluster itself (no launcher, no train): the mechanisms the rendered job
relies on — two nodes with distinct ranks and hosts, a reachable first host, the batch-shell signal
path, and requeue from inside the job."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

PY = sys.executable  # nodes share the filesystem: jobs run the host's interpreter and site-packages

# Rank 0 listens on all addresses; rank 1 resolves the first host of the allocation and sends its
# hostname over TCP. Rank 0 records what arrived.
RENDEZVOUS_TASK = """
import os, socket, sys, time
rank, master, port = int(os.environ["SLURM_NODEID"]), sys.argv[1], int(sys.argv[2])
out = sys.argv[3]
if rank == 0:
    srv = socket.create_server(("0.0.0.0", port))
    srv.settimeout(30)
    conn, _ = srv.accept()
    open(out, "w").write(conn.recv(100).decode())
else:
    deadline = time.time() + 30
    while True:
        try:
            sock = socket.create_connection((master, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    sock.sendall(f"from {socket.gethostname()} to {master}".encode())
"""

# Each task marks itself ready, then waits for SIGUSR1 and records that it arrived on its node.
SIGNAL_TASK = """
import os, signal, sys, time, pathlib
d, node = pathlib.Path(sys.argv[1]), os.environ["SLURM_NODEID"]
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
(d / f"ready-{node}").touch()
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.1)
(d / f"usr1-{node}").write_text("yes" if got else "no")
"""


def _script(body: str, *directives: str) -> str:
    header = "\n".join(f"#SBATCH {d}" for d in ("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1", *directives))
    return f"#!/bin/bash\n{header}\nset -u\n{textwrap.dedent(body)}"


def test_two_nodes_distinct_ranks_and_first_host_reachable(slurm_jobs, tmp_path: Path):
    (tmp_path / "rendezvous.py").write_text(RENDEZVOUS_TASK)
    body = f"""
    srun bash -c 'echo "$SLURM_NODEID $SLURM_PROCID $(hostname)" > ranks-$SLURM_NODEID.txt'
    MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
    srun bash -c "getent hosts $MASTER > resolve-\\$SLURM_NODEID.txt"
    srun {PY} rendezvous.py "$MASTER" $((20000 + SLURM_JOB_ID % 10000)) tcp.txt
    """
    job = slurm_jobs.submit_text(_script(body, "--output=out.txt"))
    fields = slurm_jobs.wait_state(job, "COMPLETED", timeout=60)
    assert fields["ExitCode"] == "0:0"
    ranks = sorted((tmp_path / f"ranks-{i}.txt").read_text().split() for i in (0, 1))
    assert [r[:2] for r in ranks] == [["0", "0"], ["1", "1"]]
    assert {r[2] for r in ranks} == {"node1", "node2"}
    for i in (0, 1):
        assert (tmp_path / f"resolve-{i}.txt").read_text().split()[1:] == ["node1"]
    assert (tmp_path / "tcp.txt").read_text() == "from node2 to node1"


def test_batch_shell_trap_forwards_usr1_to_every_task(slurm_jobs, tmp_path: Path):
    (tmp_path / "task.py").write_text(SIGNAL_TASK)
    # bash runs a trap only after the foreground command ends: srun goes to the background and the
    # shell waits in a loop (wait returns early, > 128, each time a trapped signal arrives).
    body = f"""
    srun {PY} task.py "$PWD" &
    SRUN_PID=$!
    trap 'echo "batch shell got USR1" >> trap.log; kill -USR1 $SRUN_PID' USR1
    while kill -0 $SRUN_PID 2>/dev/null; do wait $SRUN_PID; done
    """
    job = slurm_jobs.submit_text(_script(body, "--output=out.txt"))
    slurm_jobs.wait_state(job, "RUNNING", timeout=30)
    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    sh_wait_files(ready, timeout=30)
    slurm_jobs.signal_batch(job)
    fields = slurm_jobs.wait_state(job, "COMPLETED", timeout=60)
    assert fields["ExitCode"] == "0:0"
    assert (tmp_path / "trap.log").read_text().strip() == "batch shell got USR1"
    assert [(tmp_path / f"usr1-{i}").read_text() for i in (0, 1)] == ["yes", "yes"]


def test_requeue_from_batch_shell_restarts_with_restart_count(slurm_jobs, tmp_path: Path):
    body = """
    echo "run restart=${SLURM_RESTART_COUNT:-unset} host=$(hostname)" >> runs.log
    if [ -z "${SLURM_RESTART_COUNT:-}" ]; then
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    """
    job = slurm_jobs.submit_text(_script(body, "--output=out-%j.txt", "--open-mode=append"))
    fields = slurm_jobs.wait_state(job, "COMPLETED", timeout=90)
    assert fields["Restarts"] == "1"  # slurm 22.05 names it Restarts
    lines = (tmp_path / "runs.log").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["restart=unset", "restart=1"]


def sh_wait_files(paths: list[Path], timeout: float) -> None:
    from tests.slurm.slurm_harness import wait_until

    wait_until(lambda: all(p.exists() for p in paths), timeout, f"files {[p.name for p in paths]}")
