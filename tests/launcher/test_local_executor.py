"""The local executor's signal / exit-code protocol through the real `accelerate launch` (2 CPU workers).

The training module is a stand-in `train.py` put first on PYTHONPATH (the launcher never imports `train`,
so only the workers' `-m train` finds it) that follows the train contract: wait for
the stop file or SIGUSR1, save a checkpoint with its COMPLETE marker (every rank waits for it, as the
real save's closing barrier does), exit 75; when a complete checkpoint exists at start, "resume" and
exit 0. The lead can point this at the real `train` module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults import fault_env
from tests.launcher.conftest import cli_env
from tests.train.run_helpers import assert_sharded_checkpoint

STAND_IN = '''
import os, pathlib, signal, sys, time
import tomllib
config_path = pathlib.Path(sys.argv[sys.argv.index("--config") + 1])
run_dir = config_path.parent
cfg = tomllib.loads(config_path.read_text())
stop_file = run_dir / cfg["run"]["stop_file"]
checkpoint = run_dir / cfg["run"]["checkpoint_dir"] / "step-00000001"
rank = int(os.environ.get("RANK", "0"))
signalled = []
signal.signal(signal.SIGUSR1, lambda *_: signalled.append("USR1"))
if (checkpoint / "COMPLETE").exists():
    (run_dir / f"resumed-{rank}").touch()
    sys.exit(0)
(run_dir / f"started-{rank}").touch()
deadline = time.time() + 60
while not (signalled or stop_file.exists()) and time.time() < deadline:
    time.sleep(0.05)
(run_dir / f"stopped-{rank}-{'signal' if signalled else 'file'}").touch()
# The real stop is agreed by every rank and the save ends in a barrier: no rank exits before all
# have stopped and the marker exists. A rank that exits early makes torchrun SIGTERM the others,
# possibly one that has not yet seen the stop request, or rank 0 before it marks the checkpoint.
world = int(os.environ.get("WORLD_SIZE", "1"))
if rank == 0:
    while len(list(run_dir.glob("stopped-*"))) < world:
        time.sleep(0.05)
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "COMPLETE").touch()
else:
    while not (checkpoint / "COMPLETE").exists():
        time.sleep(0.05)
sys.exit(75)
'''


def _wait_for(paths: list[Path], timeout: float) -> None:
    deadline = time.time() + timeout
    while not all(p.exists() for p in paths):
        assert time.time() < deadline, f"timed out waiting for {[p.name for p in paths if not p.exists()]}"
        time.sleep(0.1)


def _stand_in_env(tmp_path: Path, source: str) -> dict[str, str]:
    """The CLI's environment with `source` as the `train` module the workers run (first on PYTHONPATH)."""
    module_dir = tmp_path / "standin"
    module_dir.mkdir()
    (module_dir / "train.py").write_text(source)
    env = cli_env()
    env["PYTHONPATH"] = f"{module_dir}{os.pathsep}{env['PYTHONPATH']}"
    return env


def _default_sigint() -> None:
    # A backgrounded parent may ignore SIGINT, and Python then never raises KeyboardInterrupt (Ctrl-C).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop_signal", [signal.SIGUSR1, signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_signal_checkpoints_exits_75_then_same_command_resumes(tmp_path: Path, stop_signal: signal.Signals) -> None:
    env = _stand_in_env(tmp_path, STAND_IN)
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "launcher.cli", "--model", "tiny", "--executor", "local", "--output", str(run_dir)]
    launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, preexec_fn=_default_sigint)
    try:
        _wait_for([run_dir / "started-0", run_dir / "started-1"], timeout=120)
        running = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir)], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=60)
        assert "state        RUNNING  [run.json, executor local]" in running.stdout, running.stdout + running.stderr
        cancel = subprocess.run([sys.executable, "-m", "launcher.cli", "cancel", str(run_dir)], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=60)
        assert cancel.returncode == 1 and f"kill -USR1 {launcher.pid}" in cancel.stderr, cancel.stderr  # which pid
        launcher.send_signal(stop_signal)
        output, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 75, output
    assert "run the same command again to resume" in output
    shown = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert "STOPPED (checkpointed" in shown.stdout, shown.stdout + shown.stderr
    assert (run_dir / "STOP_REQUESTED").exists()
    assert len(list(run_dir.glob("stopped-*"))) == 2, "both workers were asked to stop"
    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (run_dir / "resumed-0").exists() and (run_dir / "resumed-1").exists()
    assert not (run_dir / "STOP_REQUESTED").exists(), "a stale stop request is cleared at start"


@pytest.mark.slow
def test_real_train_module_stop_exit_75_and_resume(tmp_path: Path) -> None:
    """The real `train` package: its exit 75 is reported by torchrun as 1 and recovered by the launcher.
    Its 2 CPU ranks shard with FSDP2 over gloo: the checkpoint is the sharded layout GPU runs write."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "launcher.cli", "--model", "tiny", "--executor", "local", "--max_steps", "4",
               "--save_steps", "100", "--output", str(run_dir)]
    stopped = subprocess.run(command, cwd=tmp_path, env=fault_env(cli_env(), stop_at_step=2), capture_output=True,
                             text=True, timeout=300)
    assert stopped.returncode == 75, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    # train.async_save's default (true), but no periodic save before step 4: no writer, no staging buffers.
    output = stopped.stdout + stopped.stderr
    assert "train.async_save: no periodic save before step 4" in output, output[-3000:]
    assert (run_dir / "checkpoints" / "step-00000002" / "COMPLETE").exists()
    assert_sharded_checkpoint(run_dir / "checkpoints" / "step-00000002", world=2)
    assert not (run_dir / "FINISHED").exists(), "a stopped run is not finished"
    resumed = subprocess.run(command, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert (run_dir / "export").is_dir()
    assert json.loads((run_dir / "FINISHED").read_text()) == {"step": 4}
    # The executor exports the attempt's start: the resume's startup record counts from it, the launcher's own
    # start (accelerate, torchrun) its first phase.
    startups = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"startup"' in line]
    assert [(r["resumed"], r["origin"]) for r in startups] == [(False, "job"), (True, "job")], startups
    assert startups[-1]["phases"]["launch"] > 0, startups[-1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.slow
def test_real_train_second_ctrl_c_kills_it(tmp_path: Path) -> None:
    """README: Ctrl-C asks the run to checkpoint, a second Ctrl-C kills it. The real `train` package,
    its stop checkpoint held up (a fault stalls that save): the second SIGINT ends the launcher at once,
    no training process survives, and no checkpoint is published (nothing half-written to resume from)."""
    import json

    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "launcher.cli", "--model", "tiny", "--executor", "local", "--max_steps", "1000",
               "--save_steps", "1000", "--output", str(run_dir)]
    launcher = subprocess.Popen(command, cwd=tmp_path, env=fault_env(cli_env(), stop_at_step=2, slow_save_step=2),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint)
    try:
        _wait_for([run_dir / "checkpoints" / ".tmp-step-00000002"], timeout=240)  # the stop's save, stalled
        roster = [json.loads(line) for line in (run_dir / "logs" / "ranks.jsonl").read_text().splitlines()]
        pids = [r["pid"] for r in roster]
        launcher.send_signal(signal.SIGINT)  # first: a stop request (one is already being saved)
        time.sleep(1)
        launcher.send_signal(signal.SIGINT)  # second: kill
        output, _ = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode not in (0, 75), output
    deadline = time.monotonic() + 10  # SIGKILL is sent before the launcher exits; dying (and reaping) is not instant
    while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(pids) == 2 and not [pid for pid in pids if _alive(pid)], f"training processes survived: {pids}"
    assert not (run_dir / "checkpoints" / "step-00000002").exists(), "a checkpoint was published"


ENDS_WITH = '''
import json, os, pathlib, sys
config_path = pathlib.Path(sys.argv[sys.argv.index("--config") + 1])
code = int(os.environ["STAND_IN_EXIT"])
if code == 0 and os.environ.get("RANK", "0") == "0":
    with open(config_path.parent / "metrics.jsonl", "a") as metrics:
        metrics.write(json.dumps({"event": "done", "step": 1}) + "\\n")
if code:
    print("ValueError: the stand-in failed on purpose", file=sys.stderr)
sys.exit(code)
'''


def test_status_tells_how_a_local_run_ended(tmp_path: Path) -> None:
    """A local run records its start and end in run.json as a SLURM job does: `status` says FAILED for a
    run whose training failed, not NOT STARTED, and a failed resume of a run that once completed is
    FAILED, not the earlier COMPLETED (metrics.jsonl's old `done`)."""
    env = _stand_in_env(tmp_path, ENDS_WITH)
    run_dir = tmp_path / "run"
    launch = [sys.executable, "-m", "launcher.cli", "--model", "tiny", "--executor", "local", "--output", str(run_dir)]
    status = [sys.executable, "-m", "launcher.cli", "status", str(run_dir)]

    def state_after(code: int) -> str:  # inside an salloc session: its job is not this run's job
        ran = subprocess.run(launch, cwd=tmp_path, env={**env, "STAND_IN_EXIT": str(code), "SLURM_JOB_ID": "4711"},
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == code, ran.stdout[-2000:] + ran.stderr[-2000:]
        shown = subprocess.run(status, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return next(line for line in shown.stdout.splitlines() if line.startswith("state")).split(None, 1)[1]

    assert state_after(1).startswith("FAILED (exit 1)")
    assert state_after(0).startswith("COMPLETED")
    assert state_after(1).startswith("FAILED (exit 1)")
    record = json.loads((run_dir / "run.json").read_text())
    assert record["job_ids"] == [] and {e["job_id"] for e in record["events"]} == {""}


A100X8 = ('default_profile = "a100"\n[profiles.a100]\npartition = "gpu"\ngpus_per_node = 8\ngpu_type = "a100"\n'
          'storage_root = "runs"\n[profiles.cpu]\ngpus_per_node = 0\nprocesses_per_node = 2\nbackend = "gloo"\n'
          'storage_root = "runs"\n')


@pytest.mark.parametrize("command", [["plan"], ["--dry-run"], []], ids=["plan", "dry-run", "launch"])
def test_a_gpu_profile_on_a_machine_without_its_gpus_is_refused(tmp_path: Path, command: list[str]) -> None:
    """--executor local runs on this machine: a profile of 8 GPUs where CUDA shows none would run 8 CPU
    ranks while the plan speaks of 8 A100s. Refused in one line naming the profile and the CPU way out."""
    (tmp_path / "cluster.toml").write_text(A100X8)
    args = [sys.executable, "-m", "launcher.cli", *command, "--executor", "local", "--model", "tiny",
            "--output", str(tmp_path / "run")]
    result = subprocess.run(args, cwd=tmp_path, env=cli_env(CUDA_VISIBLE_DEVICES=""), capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--executor local" in lines[0] and "profile a100" in lines[0], lines
    assert "8 GPUs" in lines[0] and "--profile cpu" in lines[0], lines
    assert not (tmp_path / "run").exists()
