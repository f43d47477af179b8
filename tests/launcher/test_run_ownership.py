"""A run directory belongs to one job (issue #32): a launch into a run whose job still lives is refused
in one line; the launch lock lets one of two racing launches through; a dry run leaves the run
directory byte for byte as it was; the default name covers the profile's contents.

SLURM here is a stub `sbatch`/`squeue` (the real-cluster versions: tests/slurm/test_run_ownership.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.ops.ownership import RunBusy, _exclusive_file, lock_path
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli, write_stub

ARGS = ["--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu", "--model", "tiny", "--max_steps", "5"]


def _slurm_stubs(tmp_path: Path, state: str) -> dict[str, str]:
    """sbatch hands out 4242, 4243, ...; squeue reports every handed-out job in `state` (STATE file).
    Bash builtins only: PATH has no /usr/bin (the real sbatch's folder)."""
    bin_dir = tmp_path / "bin"
    (tmp_path / "STATE").write_text(state)
    (tmp_path / "next").write_text("4242")
    write_stub(bin_dir, "sbatch", f'n=$(< {tmp_path}/next); echo $((n+1)) > {tmp_path}/next\n'
                                  f'echo "$*" >> {tmp_path}/sbatch-calls; echo $n\n')
    write_stub(bin_dir, "squeue", f'n=$(< {tmp_path}/next)\n'
                                  f'for ((j=4242; j<n; j++)); do echo "$j|$(< {tmp_path}/STATE)"; done\n')
    return cli_env(PATH=f"{bin_dir}{os.pathsep}{path_without('sbatch')}")


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_launch_into_a_live_run_is_refused_in_one_line_then_resumes_once_it_ended(tmp_path: Path) -> None:
    env = _slurm_stubs(tmp_path, "RUNNING")
    args = [*ARGS, "--output", str(tmp_path / "run")]
    assert run_cli(args, tmp_path, env=env).returncode == 0
    before = _snapshot(tmp_path / "run")
    refused = run_cli(args, tmp_path, env=env)
    assert refused.returncode == 1 and refused.stdout == "", refused.stdout
    lines = refused.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sft-launch: error: "), refused.stderr
    for text in ("job 4242 is RUNNING", "sft-launch logs", " -f", "sft-launch status", "sft-launch cancel"):
        assert text in lines[0], lines[0]
    assert _snapshot(tmp_path / "run") == before, "the refused launch touched the run directory"
    assert len((tmp_path / "sbatch-calls").read_text().splitlines()) == 1
    (tmp_path / "STATE").write_text("PENDING")
    assert "job 4242 is PENDING" in run_cli(args, tmp_path, env=env).stderr
    (tmp_path / "STATE").write_text("COMPLETED")
    resumed = run_cli(args, tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["job_ids"] == ["4242", "4243"]


def test_a_launch_in_progress_holds_the_lock(tmp_path: Path) -> None:
    env = _slurm_stubs(tmp_path, "RUNNING")
    run = tmp_path / "run"
    with open(lock_path(run), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write("pid 99 on loginnode (sbatch executor) since now")
        handle.flush()
        busy = run_cli([*ARGS, "--output", str(run)], tmp_path, env=env)
    assert busy.returncode == 1
    assert "another sft-launch is launching into it now (pid 99 on loginnode" in busy.stderr
    assert not run.exists() and not (tmp_path / "sbatch-calls").exists()
    assert run_cli([*ARGS, "--output", str(run)], tmp_path, env=env).returncode == 0  # released: goes ahead


def test_racing_launches_submit_one_job(tmp_path: Path) -> None:
    env = _slurm_stubs(tmp_path, "PENDING")
    args = [sys.executable, "-m", "launcher.cli", *ARGS, "--output", str(tmp_path / "run")]
    procs = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    codes = [p.wait(timeout=120) for p in procs]
    assert sorted(codes) == [0, 1, 1, 1], [p.stderr.read() for p in procs]
    assert len((tmp_path / "sbatch-calls").read_text().splitlines()) == 1
    assert json.loads((tmp_path / "run" / "run.json").read_text())["job_ids"] == ["4242"]


def test_dry_run_leaves_an_existing_run_byte_identical(tmp_path: Path) -> None:
    env = _slurm_stubs(tmp_path, "COMPLETED")
    run = tmp_path / "run"
    assert run_cli([*ARGS, "--output", str(run)], tmp_path, env=env).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text(EXAMPLE_CLUSTER.read_text().replace('time = "2:00:00"', 'time = "3:00:00"'))
    before = _snapshot(run)
    names = sorted(p.name for p in tmp_path.iterdir())
    dry = run_cli(["--cluster", str(other), *ARGS[2:], "--output", str(run), "--dry-run"], tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert _snapshot(run) == before, "the dry run changed a file"
    assert re.search(r"a launch would resume .*/run, rewriting: launch.slurm; run.json: cluster_file, profile, "
                     r"time_limit", dry.stdout), dry.stdout
    same = run_cli([*ARGS, "--output", str(run), "--dry-run"], tmp_path, env=env)
    assert "with the same files" in same.stdout, same.stdout
    (tmp_path / "STATE").write_text("RUNNING")
    busy = run_cli([*ARGS, "--output", str(run), "--dry-run"], tmp_path, env=env)
    assert busy.returncode == 0 and "a launch now would be refused: " in busy.stdout
    assert _snapshot(run) == before and sorted(p.name for p in tmp_path.iterdir()) == names


def test_dry_run_leaves_nothing_that_runs_lists(tmp_path: Path) -> None:
    env = _slurm_stubs(tmp_path, "COMPLETED")
    assert run_cli([*ARGS, "--dry-run"], tmp_path, env=env).returncode == 0
    assert not (tmp_path / "runs").exists()
    listing = run_cli(["runs", "--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu"], tmp_path, env=env)
    assert listing.returncode == 0 and listing.stdout.startswith("no runs under"), listing.stdout


def _default_dir(tmp_path: Path, cluster: Path, *extra: str) -> str:
    result = run_cli(["--cluster", str(cluster), *ARGS[2:], *extra, "--dry-run"], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 0, result.stderr
    return re.search(r"a launch would create (\S+)", result.stdout)[1]


def test_default_run_dir_covers_the_profile_contents_not_the_time_limit(tmp_path: Path) -> None:
    base = _default_dir(tmp_path, EXAMPLE_CLUSTER)
    env_changed = tmp_path / "env.toml"
    env_changed.write_text(EXAMPLE_CLUSTER.read_text().replace('cpus_per_task = 8 ', 'cpus_per_task = 4 '))
    longer = tmp_path / "longer.toml"
    longer.write_text(EXAMPLE_CLUSTER.read_text().replace('time = "2:00:00"', 'time = "9:00:00"'))
    assert _default_dir(tmp_path, env_changed) != base, "same profile name, other contents: another run"
    assert _default_dir(tmp_path, longer) == base == _default_dir(tmp_path, EXAMPLE_CLUSTER, "--time", "5:00:00")


def test_a_live_local_run_owns_its_directory(tmp_path: Path) -> None:
    """The local executor holds the launch lock while it trains: a second launch is refused at once."""
    args = [sys.executable, "-m", "launcher.cli", "--executor", "local", "--model", "tiny", "--max_steps", "100000",
            "--output", str(tmp_path / "run")]
    first = subprocess.Popen(args, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "metrics.jsonl").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
            time.sleep(0.5)
        second = run_cli(args[3:], tmp_path)
        assert second.returncode == 1 and len(second.stderr.splitlines()) == 1, second.stderr
        assert f"a local run is training in it (pid {first.pid} on" in second.stderr
        assert "kill -USR1" in second.stderr
    finally:
        first.send_signal(signal.SIGUSR1)
        assert first.wait(timeout=120) == 75


def test_report_to_wandb_keeps_metrics_jsonl_for_status_and_plot(tmp_path: Path) -> None:
    """`--report_to wandb` adds wandb (disabled here: no network); metrics.jsonl is still written. Each
checkpoint is one line of ours (accelerate's INFO lines about each file it saves are silenced)."""
    run = tmp_path / "run"
    trained = run_cli(["--executor", "local", "--model", "tiny", "--max_steps", "4", "--logging_steps", "1",
                       "--save_steps", "2", "--report_to", "wandb", "--output", str(run)], tmp_path,
                      env=cli_env(WANDB_MODE="disabled"), timeout=300)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    saves = [line for line in trained.stdout.splitlines() if "checkpoint saved" in line]
    assert len(saves) == len(list((run / "checkpoints").glob("step-*"))) >= 1, saves
    assert " INFO accelerate" not in trained.stdout, "accelerate's own save narration is silenced"
    status = run_cli(["status", str(run), "--json"], tmp_path)
    assert status.returncode == 0 and json.loads(status.stdout)["step"] == 4, status.stdout + status.stderr
    plot = run_cli(["plot", str(run)], tmp_path)
    assert plot.returncode == 0 and (run / "metrics.png").stat().st_size > 0, plot.stderr


def test_the_o_excl_fallback_refuses_a_live_holder_and_reclaims_a_dead_ones(tmp_path: Path) -> None:
    """Where flock is refused (NFS without lockd): the O_EXCL lock file with pid and host."""
    run, lock = tmp_path / "run", tmp_path / ".run.lock.excl"
    with _exclusive_file(lock, run, f"pid {os.getpid()} on {socket.gethostname()} (sbatch executor) since now"):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")
        with pytest.raises(RunBusy, match="another sft-launch is launching into it now"):
            with _exclusive_file(lock, run, "pid 1 on x (sbatch executor) since now"):
                pass
    assert not lock.exists(), "released: the lock file is removed"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"pid {dead.stdout.strip()} on {socket.gethostname()} (sbatch executor) since then")
    with _exclusive_file(lock, run, f"pid {os.getpid()} on {socket.gethostname()} (sbatch executor) since now"):
        assert f"pid {os.getpid()} " in lock.read_text(), "a dead holder's lock on this host is reclaimed"
    lock.write_text("pid 4242 on some-other-host (local executor) since then")
    with pytest.raises(RunBusy, match="a local run is training in it"):
        with _exclusive_file(lock, run, "pid 1 on x (sbatch executor) since now"):
            pass
