"""Run the rendered launch.slurm for real with stub `srun` / `scontrol` on PATH that record their argv.

Proves: hostile run dir / job name / env values render safely (nothing executes), per-node expansion
is deferred, the USR1 trap writes the stop file, exit 75 requeues, timeouts vs preemptions are counted
apart and capped, run.json records each (re)start, and a failed node command leaves torchrun's traceback
in the rank logs and the cause as the log's last line.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.shellcheck import shellcheck
from tests.launcher.conftest import GOLDEN_DIR, REPO, write_stub
from launcher.resolve.options import LaunchRequest, resolve
from launcher.execute.render import write_run_dir

# The stub plays SLURM and training: USR1 to the batch shell, wait (bounded) until its trap wrote the
# stop file (training's only channel), then "checkpoint" and exit 75. Waiting for the file, not a fixed
# sleep, keeps a loaded machine from turning a slow trap into a failure.
STOP_AND_WAIT = ('kill -USR1 "$PPID"; for _ in $(seq 100); do [[ -e STOP_REQUESTED ]] && break; '
                 'sleep 0.1; done; ')
STOP_THEN_75 = STOP_AND_WAIT + "exit 75"
HOSTILE = "we ird 'q\" $(touch PWNED) ; `touch PWNED2` é☃ \\n"


def _srun_stub(bin_dir: Path, behaviour: str) -> None:
    # Records argv (NUL-separated) and the env value, then does `behaviour` and exits with its status.
    write_stub(bin_dir, "srun", f"""
trap 'echo USR1 >> "$STUB_LOG/srun.signals"' USR1  # real srun forwards it to the tasks
printf '%s\\0' "$@" > "$STUB_LOG/srun.argv"
printf '%s' "${{WEIRD_VALUE-unset}}" > "$STUB_LOG/srun.env"
{behaviour}
""")
    # scontrol: `show node` gives a NodeAddr; `show job` tells the job's state ($STUB_JOB_STATE, RUNNING)
    # and PreemptTime ($STUB_PREEMPT_TIME, None by default);
    # `requeue` fails the first $STUB_FAIL_REQUEUE times (a controller timing out).
    write_stub(bin_dir, "scontrol", """
printf '%s\\0' "$@" >> "$STUB_LOG/scontrol.argv"
if [[ "$1 $2" == "show node" ]]; then
  echo "NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.${4#node} NodeHostName=$4"
elif [[ "$1 $2" == "show job" ]]; then
  echo "JobId=4242 JobState=${STUB_JOB_STATE:-RUNNING} PreemptTime=${STUB_PREEMPT_TIME:-None} ExcNodeList=(null)"
elif [[ "$1" == show ]]; then
  printf 'node1\\nnode2\\n'
elif [[ "$1" == requeue ]]; then
  failed=$(cat "$STUB_LOG/requeue.failed" 2>/dev/null || echo 0)
  if ((failed < ${STUB_FAIL_REQUEUE:-0})); then
    echo $((failed + 1)) > "$STUB_LOG/requeue.failed"
    echo "scontrol: error: Socket timed out on send/recv operation" >&2
    exit 1
  fi
fi
""")


def _render(tmp_path: Path, run_name: str, sets: list[str], time_limit: str = "1:00:00") -> Path:
    request = LaunchRequest(model="tiny", executor="local", output=str(tmp_path / run_name), job_name=HOSTILE,
                            time=time_limit, sets=sets)
    return write_run_dir(resolve(request), ["sft-launch", "test"])


def _run_script(tmp_path: Path, run_dir: Path, behaviour: str, restart: int | None = None,
                elapsed_s: int | None = None, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """Run the batch script with stubs; `elapsed_s` starts bash's $SECONDS there (bash imports it from
    the environment), i.e. pretends the job has already run that long when the signal arrives."""
    bin_dir, log_dir = tmp_path / "bin", tmp_path / "stublog"
    log_dir.mkdir(exist_ok=True)
    _srun_stub(bin_dir, behaviour)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", STUB_LOG=str(log_dir), SLURM_JOB_ID="4242",
               SLURM_NNODES="2", SLURM_JOB_NODELIST="node[1-2]", PYTHONPATH=str(REPO))
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = str(restart)
    if elapsed_s is not None:
        env["SECONDS"] = str(elapsed_s)
    env.update(env_extra)
    return subprocess.run(["bash", str(run_dir / "launch.slurm")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)


def _argv(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def test_hostile_names_render_safely_and_nothing_executes(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, HOSTILE.replace("\\n", "n"), [f"profile.env.WEIRD_VALUE={HOSTILE}"])
    lint = shellcheck(run_dir / "launch.slurm")
    assert lint.returncode == 0, lint.stdout
    result = _run_script(tmp_path, run_dir, "exit 0")
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))
    argv = _argv(tmp_path / "stublog" / "srun.argv")
    # Values arrive intact as arguments; $SLURM_NODEID stays unexpanded for each node's own shell.
    assert argv[argv.index("_") + 1] == str(run_dir / "accelerate.yaml")
    assert argv[-1] == str(run_dir / "train.toml")
    command = next(a for a in argv if "accelerate launch" in a)
    assert '--machine_rank "$SLURM_NODEID"' in command and '--num_machines "$SLURM_NNODES"' in command
    # MASTER_ADDR: the first node's NodeAddr, the address SLURM itself reaches it at (not its name).
    assert argv[argv.index("_") + 2 : argv.index("_") + 5] == ["4", "10.0.0.1", str(20000 + 4242 % 10000)]
    assert (tmp_path / "stublog" / "srun.env").read_text() == HOSTILE
    log = (run_dir / "logs" / "4242-r0.log").read_text()
    assert "training exited with 0" in log
    record = json.loads((run_dir / "run.json").read_text())
    assert record["job_ids"] == ["4242"] and [e["event"] for e in record["events"]] == ["start", "finish"]


def test_job_name_is_sanitized_on_sbatch_line(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    (line,) = [l for l in (run_dir / "launch.slurm").read_text().splitlines() if l.startswith("#SBATCH --job-name")]
    assert line == "#SBATCH --job-name=we_ird_q_touch_PWNED_touch_PWNED2_n"


def test_exit_75_after_early_signal_is_a_preemption_and_requeues(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    # The stub plays SLURM: USR1 to the batch shell, then training "checkpoints" and exits 75.
    result = _run_script(tmp_path, run_dir, STOP_THEN_75, restart=2)
    assert result.returncode == 0, result.stderr
    assert (run_dir / "STOP_REQUESTED").exists()
    assert not (tmp_path / "stublog" / "srun.signals").exists(), "the stop file, not a signal, reaches the step"
    assert _argv(tmp_path / "stublog" / "scontrol.argv")[-2:] == ["requeue", "4242"]
    assert "preemption" in (run_dir / "logs" / "4242-r2.log").read_text()
    events = json.loads((run_dir / "run.json").read_text())["events"]
    assert events[-1]["event"] == "requeue" and events[-1]["kind"] == "preemption" and events[-1]["restart"] == 2


def test_exit_75_at_the_moment_of_the_signal_is_not_lost(tmp_path: Path) -> None:
    # srun exits amid a burst of signals to the batch shell: a `wait` interrupted by the trap returns
    # 138 and bash may have lost srun's status by then. The script must still see srun's own 75.
    for attempt in range(4):
        base = tmp_path / str(attempt)
        run_dir = _render(base, "run", [])
        result = _run_script(base, run_dir, 'for _ in $(seq 30); do kill -USR1 "$PPID"; done; exit 75')
        assert result.returncode == 0, (attempt, result.returncode)
        assert _argv(base / "stublog" / "scontrol.argv")[-2:] == ["requeue", "4242"], attempt


def test_cancel_request_checkpoints_without_requeue(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    (run_dir / "CANCEL_REQUESTED").touch()  # what `sft-launch cancel` writes before signalling
    result = _run_script(tmp_path, run_dir, STOP_THEN_75)
    assert result.returncode == 0, result.stderr
    scontrol = tmp_path / "stublog" / "scontrol.argv"
    assert not scontrol.exists() or "requeue" not in _argv(scontrol)
    events = json.loads((run_dir / "run.json").read_text())["events"]
    assert events[-1]["event"] == "finish" and events[-1]["outcome"] == "cancelled"
    _render(tmp_path, "run", [])  # launching the run again clears the request
    assert not (run_dir / "CANCEL_REQUESTED").exists()


def test_timeouts_are_counted_and_capped(tmp_path: Path) -> None:
    # 2-minute limit, 60 s lead: the time-limit signal comes at ~60 s; the threshold is 0.8 x 120 s capped
    # at limit - lead - 60 s (SLURM may signal a minute early), clamped to 1 s.
    run_dir = _render(tmp_path, "run", ["profile.signal_lead_s=60", "profile.max_timeouts=1"], time_limit="2")
    assert "TIMEOUT_AFTER_S=1\n" in (run_dir / "launch.slurm").read_text()
    behaviour = STOP_THEN_75
    first = _run_script(tmp_path, run_dir, behaviour, restart=0, elapsed_s=60)
    assert first.returncode == 0 and (run_dir / "logs" / "timeouts.txt").read_text().count("\n") == 1
    second = _run_script(tmp_path, run_dir, behaviour, restart=1, elapsed_s=60)
    assert second.returncode == 75, "the second timeout exceeds max_timeouts = 1: give up, no requeue"
    assert _argv(tmp_path / "stublog" / "scontrol.argv").count("requeue") == 1
    assert json.loads((run_dir / "run.json").read_text())["events"][-1]["outcome"] == "gave-up"


def test_short_limit_early_signal_is_a_preemption_not_a_timeout(tmp_path: Path) -> None:
    # 5-minute limit: the threshold used to be max(0, limit - 10 min) = 0, so every signal was a "timeout".
    run_dir = _render(tmp_path, "run", ["profile.signal_lead_s=60", "profile.max_timeouts=0"], time_limit="5")
    assert "TIMEOUT_AFTER_S=180\n" in (run_dir / "launch.slurm").read_text()
    result = _run_script(tmp_path, run_dir, STOP_THEN_75, elapsed_s=10)
    assert result.returncode == 0 and "requeue" in _argv(tmp_path / "stublog" / "scontrol.argv")
    assert not (run_dir / "logs" / "timeouts.txt").exists()
    assert json.loads((run_dir / "run.json").read_text())["events"][-1]["kind"] == "preemption"


def test_checkpoint_after_stop_counts_as_75_when_torchrun_reports_1(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    behaviour = (STOP_AND_WAIT + 'mkdir -p "$PWD/checkpoints/step-00000007"; '
                 'touch "$PWD/checkpoints/step-00000007/COMPLETE"; exit 1')
    result = _run_script(tmp_path, run_dir, behaviour)
    assert result.returncode == 0
    assert "requeue" in _argv(tmp_path / "stublog" / "scontrol.argv")


def test_failure_without_checkpoint_is_not_requeued(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    (run_dir / "STOP_REQUESTED").touch()  # stale: removed at job start
    time.sleep(0.01)
    result = _run_script(tmp_path, run_dir, "exit 1")
    assert result.returncode == 1 and not (tmp_path / "stublog" / "scontrol.argv").read_text().count("requeue")
    assert not (run_dir / "STOP_REQUESTED").exists()


def test_a_python_that_cannot_run_the_helpers_stops_the_job_at_once_with_one_line(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", ["profile.python=/nonexistent/python3"])
    result = _run_script(tmp_path, run_dir, "exit 0")
    assert result.returncode == 2
    assert not (tmp_path / "stublog" / "srun.argv").exists(), "training must not start without its requeue decisions"
    line = (run_dir / "logs" / "batch_failures.txt").read_text().strip()
    assert line.startswith("4242 0 ") and "'/nonexistent/python3'" in line and "set python in the profile" in line


def test_requeue_needs_no_sft_launch_installed_on_the_node(tmp_path: Path) -> None:
    # The node's python sees neither the installed package (-S: no site-packages) nor PYTHONPATH: the
    # batch shell's helpers run from the run directory's copy (a container's package is not the host's).
    bare = write_stub(tmp_path / "bin", "bare-python", f'exec {sys.executable} -S "$@"')
    run_dir = _render(tmp_path, "run", [f"profile.python={bare}"])
    behaviour = (STOP_AND_WAIT + 'mkdir -p "$PWD/checkpoints/step-00000007"; '
                 'touch "$PWD/checkpoints/step-00000007/COMPLETE"; exit 1')
    result = _run_script(tmp_path, run_dir, behaviour, PYTHONPATH="")
    assert result.returncode == 0, (run_dir / "logs" / "4242-r0.log").read_text()
    assert "requeue" in _argv(tmp_path / "stublog" / "scontrol.argv")
    assert [e["event"] for e in json.loads((run_dir / "run.json").read_text())["events"]] == ["start", "requeue"]


# Training as a dead rank 1 leaves it: both ranks in the roster, only rank 0's lost-peer record (exit 76).
RANK_1_VANISHED = (
    'now=$(date +%s); mkdir -p "$PWD/logs"; '
    'for r in 0 1; do echo "{\\"time\\": $now, \\"rank\\": $r, \\"host\\": \\"node$((r + 1))\\", \\"pid\\": 1, '
    '\\"job\\": \\"4242\\", \\"restart\\": 0}" >> "$PWD/logs/ranks.jsonl"; done; '
    'echo "{\\"time\\": $now, \\"rank\\": 0, \\"host\\": \\"node1\\", \\"exit_code\\": 76, \\"follow_on\\": false, '
    '\\"message\\": \\"collective failed: Connection reset by peer\\"}" >> "$PWD/logs/failures.jsonl"; exit 1')


def test_blamed_node_is_excluded_and_the_job_requeued_until_the_budget_is_spent(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", ["profile.max_node_failures=1"])
    write_stub(tmp_path / "bin", "sinfo", "printf 'node1 mixed\\nnode2 mixed\\n'")  # SLURM sees nothing wrong
    first = _run_script(tmp_path, run_dir, RANK_1_VANISHED)
    assert first.returncode == 0, first.stderr
    calls = _argv(tmp_path / "stublog" / "scontrol.argv")
    # A running job's ExcNodeList cannot change: requeue held, exclude, release.
    assert calls[calls.index("requeuehold"):] == ["requeuehold", "4242", "update", "JobId=4242", "ExcNodeList=node2",
                                                  "release", "4242"]
    assert (run_dir / "logs" / "node_failures.txt").read_text().startswith("4242 0 node2 rank 1 on node2 died")
    requeue = json.loads((run_dir / "run.json").read_text())["events"][-1]
    assert (requeue["event"], requeue["kind"], requeue["node"]) == ("requeue", "node-failure", "node2")
    second = _run_script(tmp_path, run_dir, RANK_1_VANISHED, restart=1)
    assert second.returncode == 76, "the second node failure exceeds max_node_failures = 1: the usual failure"
    log = (run_dir / "logs" / "4242-r1.log").read_text().strip().splitlines()
    assert "exceed max_node_failures=1; not requeueing" in "\n".join(log)
    assert log[-1].startswith("sft-launch: error: rank 0 on node1: collective failed")
    assert _argv(tmp_path / "stublog" / "scontrol.argv").count("requeuehold") == 1


def test_a_failed_node_command_ends_the_log_with_the_cause_and_keeps_tracebacks_in_the_rank_logs(
        tmp_path: Path) -> None:
    """srun runs the rendered node command (SLURM_NODEID 0) with a stub `accelerate` that prints
    progress, records rank 0's failure and dies like torchrun: the log keeps the progress, ends with
    the cause; torchrun's traceback is in this attempt's launcher log."""
    run_dir = _render(tmp_path, "run", [])
    write_stub(tmp_path / "bin", "accelerate", f"""
printf '%s\\0' "$@" > "$STUB_LOG/accelerate.argv"
echo "[rank 0] INFO train.engine.loop: step 1/2 loss 5.5"
{sys.executable} -c 'from pathlib import Path; from contract.failure import record_failure; \
record_failure(Path.cwd(), 2, "bad.jsonl:7: invalid JSON")'
printf 'Traceback (most recent call last):\\nChildFailedError: train FAILED\\n' >&2
exit 1
""")
    result = _run_script(tmp_path, run_dir, 'while [[ "$1" != bash ]]; do shift; done; SLURM_NODEID=0 "$@"')
    log = (run_dir / "logs" / "4242-r0.log").read_text().strip().splitlines()
    assert result.returncode == 2, (result.stderr, log)
    assert "[rank 0] INFO train.engine.loop: step 1/2 loss 5.5" in log, log
    assert not any("Traceback" in line or "ChildFailedError" in line for line in log), log
    rank_logs = run_dir / "logs" / "ranks" / "4242-r0"
    assert log[-2:] == [f"sft-launch: every rank's output: {rank_logs}/",
                        f"sft-launch: error: rank 0 ({socket.gethostname()}): bad.jsonl:7: invalid JSON"], log
    [launcher_log] = rank_logs.glob("launcher-*.log")
    assert "ChildFailedError: train FAILED" in launcher_log.read_text()
    argv = _argv(tmp_path / "stublog" / "accelerate.argv")
    assert argv[-4:] == ["--config", str(run_dir / "train.toml"), "--attempt", "4242-r0"]


# --- signals at every instant, SLURM's preemption, a failing controller (issue #34) ---
CHECKPOINT = 'mkdir -p "$PWD/checkpoints/step-00000007"; touch "$PWD/checkpoints/step-00000007/COMPLETE"; '


def _events(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text())["events"]


def _requeues(tmp_path: Path) -> int:
    calls = tmp_path / "stublog" / "scontrol.argv"
    return _argv(calls).count("requeue") if calls.exists() else 0


def _job_reads(tmp_path: Path) -> int:
    """How many times the script read its job record (`scontrol show job`)."""
    calls = tmp_path / "stublog" / "scontrol.argv"
    argv = _argv(calls) if calls.exists() else []
    return sum(1 for a, b in zip(argv, argv[1:]) if (a, b) == ("show", "job"))


def test_sigterm_checkpoints_and_never_requeues(tmp_path: Path) -> None:
    # A plain scancel: SIGTERM to the batch shell (and the steps); training checkpoints; torchrun says 1.
    run_dir = _render(tmp_path, "run", [])
    behaviour = STOP_AND_WAIT.replace("-USR1", "-TERM") + CHECKPOINT + "exit 1"
    result = _run_script(tmp_path, run_dir, behaviour, STUB_JOB_STATE="CANCELLED")
    assert result.returncode == 0 and _requeues(tmp_path) == 0
    assert "cancelled (SIGTERM) at a complete checkpoint; not requeueing" in (run_dir / "logs" / "4242-r0.log").read_text()
    assert (_events(run_dir)[-1]["event"], _events(run_dir)[-1]["outcome"]) == ("finish", "cancelled")


def test_sigterm_of_a_node_failure_leaves_the_decision_and_the_evidence_to_slurm(tmp_path: Path) -> None:
    # SLURM ends the job because a node died (NODE_FAIL, it requeues the job itself): no requeue, no
    # outcome here, and logs/attempt.txt stays so that the restart blames the node.
    run_dir = _render(tmp_path, "run", [])
    behaviour = STOP_AND_WAIT.replace("-USR1", "-TERM") + "exit 1"
    result = _run_script(tmp_path, run_dir, behaviour, STUB_JOB_STATE="NODE_FAIL")
    assert result.returncode == 1 and _requeues(tmp_path) == 0
    assert "SIGTERM while SLURM ends the job (NODE_FAIL); not requeueing" in (run_dir / "logs" / "4242-r0.log").read_text()
    assert _job_reads(tmp_path) == 1  # PreemptTime and JobState from one read
    assert [e["event"] for e in _events(run_dir)] == ["start"]
    assert (run_dir / "logs" / "attempt.txt").read_text().startswith("4242 0 ")


def test_a_second_signal_after_the_checkpoint_does_not_undo_it(tmp_path: Path) -> None:
    # USR1 -> complete checkpoint -> TERM (sft-launch cancel's scancel, or the time limit) before srun ends.
    run_dir = _render(tmp_path, "run", [])
    behaviour = STOP_AND_WAIT + "sleep 0.05; " + CHECKPOINT + 'kill -TERM "$PPID"; sleep 1.5; exit 1'
    result = _run_script(tmp_path, run_dir, behaviour)
    marker = run_dir / "checkpoints" / "step-00000007" / "COMPLETE"
    assert marker.stat().st_mtime >= (run_dir / "STOP_REQUESTED").stat().st_mtime, "the stop file was touched again"
    assert result.returncode == 0 and _requeues(tmp_path) == 1
    assert _events(run_dir)[-1]["kind"] == "preemption"


@pytest.mark.parametrize("signal", ["USR1", "TERM"])
def test_a_signal_during_the_setup_lines_is_not_lost(tmp_path: Path, signal: str) -> None:
    # Before training starts (module loads, venv activation): the trap is already there; training is not
    # started at all, and the newest complete checkpoint stands.
    run_dir = _render(tmp_path, "run", [f'profile.setup=["kill -{signal} $$; sleep 0.2"]'])
    result = _run_script(tmp_path, run_dir, "exit 0", STUB_JOB_STATE="RUNNING" if signal == "USR1" else "CANCELLED")
    assert result.returncode == 0, (run_dir / "logs" / "4242-r0.log").read_text()
    assert not (tmp_path / "stublog" / "srun.argv").exists()
    assert _requeues(tmp_path) == (1 if signal == "USR1" else 0)
    assert _events(run_dir)[-1]["event"] == ("requeue" if signal == "USR1" else "finish")


def test_a_signal_while_srun_starts_reaches_training_through_the_stop_file(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    behaviour = 'kill -USR1 "$PPID"; sleep 1.2; [[ -e STOP_REQUESTED ]] || exit 9; ' + CHECKPOINT + "exit 1"
    result = _run_script(tmp_path, run_dir, behaviour)
    assert result.returncode == 0 and _requeues(tmp_path) == 1


def test_a_preemption_slurm_reports_requeues_even_when_the_save_was_cut_short(tmp_path: Path) -> None:
    # PreemptMode=REQUEUE without send_user_signal: only the steps get SIGTERM; the batch shell asks SLURM.
    run_dir = _render(tmp_path, "run", [])
    preempted = {"STUB_PREEMPT_TIME": "2026-11-26T14:00:00"}
    saved = _run_script(tmp_path, run_dir, 'touch STOP_REQUESTED; sleep 0.05; ' + CHECKPOINT + "exit 1", **preempted)
    assert saved.returncode == 0 and _requeues(tmp_path) == 1
    assert (_events(run_dir)[-1]["event"], _events(run_dir)[-1]["kind"]) == ("requeue", "preemption")
    killed = _run_script(tmp_path, run_dir, "exit 143", restart=1, **preempted)  # SIGKILLed mid-save
    assert killed.returncode == 0 and _requeues(tmp_path) == 2


def test_a_stop_nobody_asked_to_requeue_is_not_requeued(tmp_path: Path) -> None:
    # Training stopped at a checkpoint (a SIGTERM to the steps only), no signal here, no preemption reported.
    run_dir = _render(tmp_path, "run", [])
    result = _run_script(tmp_path, run_dir, 'touch STOP_REQUESTED; sleep 0.05; ' + CHECKPOINT + "exit 1")
    assert result.returncode == 0 and _requeues(tmp_path) == 0
    assert _events(run_dir)[-1]["outcome"] == "stopped"


def test_scontrol_requeue_is_retried_and_a_lasting_failure_is_one_line(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", [])
    result = _run_script(tmp_path, run_dir, STOP_THEN_75, STUB_FAIL_REQUEUE="2")
    assert result.returncode == 0 and _requeues(tmp_path) == 3
    assert _events(run_dir)[-1]["event"] == "requeue"
    (tmp_path / "stublog" / "scontrol.argv").unlink()
    (tmp_path / "stublog" / "requeue.failed").unlink()
    result = _run_script(tmp_path, run_dir, STOP_THEN_75, restart=1, STUB_FAIL_REQUEUE="9")
    assert result.returncode == 1 and _requeues(tmp_path) == 5
    assert _events(run_dir)[-1]["outcome"] == "requeue-failed"
    (line,) = (run_dir / "logs" / "batch_failures.txt").read_text().splitlines()
    assert line.startswith("4242 1 ") and "scontrol requeue 4242 (5 tries" in line


def test_a_failing_setup_line_is_recorded_with_its_exit_code(tmp_path: Path) -> None:
    run_dir = _render(tmp_path, "run", ['profile.setup=["module_load_that_fails() { return 3; }", '
                                        '"module_load_that_fails cuda/12"]'])
    result = _run_script(tmp_path, run_dir, "exit 0")
    assert result.returncode == 3
    (line,) = (run_dir / "logs" / "batch_failures.txt").read_text().splitlines()
    assert line.startswith("4242 0 ") and line.endswith(" 3 setup line `module_load_that_fails cuda/12`"), line
    assert "sft-launch: error: setup line `module_load_that_fails cuda/12` exited with 3" in \
        (run_dir / "logs" / "4242-r0.log").read_text()
    from launcher.ops.status import run_status  # `sft-launch status` shows it, SLURM having forgotten the job

    assert run_status(run_dir, query=lambda job_id: None)["error"] == \
        "batch script of job 4242 restart 0: setup line `module_load_that_fails cuda/12` exited with 3"


def test_budgets_count_this_submission_only(tmp_path: Path) -> None:
    # An earlier submission's time-limit hits and blamed nodes do not count against this job.
    run_dir = _render(tmp_path, "run", ["profile.signal_lead_s=60", "profile.max_timeouts=1"], time_limit="2")
    (run_dir / "logs" / "timeouts.txt").write_text("1111 0 70\n1111 1 70\n")
    result = _run_script(tmp_path, run_dir, STOP_THEN_75, elapsed_s=60)
    assert result.returncode == 0 and _requeues(tmp_path) == 1
    assert _events(run_dir)[-1]["kind"] == "timeout" and str(_events(run_dir)[-1]["timeouts"]) == "1"


# A command or process substitution: $(...) (not arithmetic $((...))), <(...), >(...).
SUBSTITUTION = re.compile(r"\$\((?!\()|[<>]\(")
TRAP = re.compile(r"^\s*trap '([^']*)' [A-Z]")


def test_no_command_expands_two_substitutions_and_every_trap_parses(tmp_path: Path) -> None:
    # bash 5.2 runs the trap of a signal that came during a command's first substitution inside its parse of
    # the second, where the trap's text fails to parse ("trap: line 2: unexpected EOF while looking for
    # matching `)'", the SLURM preemption test's flake): the signal is lost and `set -e` ends the script.
    scripts = [_render(tmp_path, "run", []) / "launch.slurm", *sorted(GOLDEN_DIR.glob("*/launch.slurm"))]
    for script in scripts:
        command = ""
        for number, line in enumerate(script.read_text().splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            command += line
            if line.endswith("\\"):
                continue
            assert len(SUBSTITUTION.findall(command)) <= 1, f"{script}:{number}: two substitutions in `{command}`"
            command = ""
        traps = [match[1] for line in script.read_text().splitlines() if (match := TRAP.match(line))]
        assert len(traps) >= 3, f"{script}: the stop traps are not where this test looks"
        for handler in traps:
            parsed = subprocess.run(["bash", "-n", "-c", handler], capture_output=True, text=True)
            assert parsed.returncode == 0, f"{script}: trap {handler!r}: {parsed.stderr}"
