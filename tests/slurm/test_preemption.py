"""Preemption and cancellation as SLURM really does them (#34), on the local cluster's partition tiers.

slurm.conf.in: PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, GraceTime=60 on `cpu`, no
PreemptParameters=send_user_signal. A job of partition `urgent` (higher PriorityTier, --exclusive on
every node) preempts the training jobs at a random step: SLURM sets their PreemptTime and SIGTERMs
their steps only (no signal reaches the batch shell). Training checkpoints; the batch shell learns of
the preemption from SLURM and requeues; the job comes back after the urgent one, by itself, and
finishes bitwise equal to an uninterrupted run:
- preempt-fast: a preemption while the asynchronous write of step 10 is in flight (tests/faults holds it
  until the stop): the stop-save finishes that write instead of starting another;
- preempt-slow: the stop-save stalls 40 s (tests/faults: slow_stop_save_s), longer than torchrun's 30 s
  SIGTERM-to-SIGKILL default that used to kill the ranks mid-save and lose the run.
And a plain `scancel` of a running job ends it for good: never requeued, `status` says CANCELLED. A SIGTERM
to the steps during the final export (after the last step's stop vote) lets the run finish: torchrun exits 1
for its own SIGTERM, the run's FINISHED file says it finished, and the job is not requeued to train again.
A signal at each point of the batch script: USR1 while the setup lines run (training is not started;
the job requeues), USR1 then TERM once the checkpoint answering it is complete (the TERM must not undo
it), with a controller that refuses the first two `scontrol requeue` calls (retried).

Two phases (an exclusive urgent job preempts every training job on the cluster): the baseline, the
scancel run and the signal runs first, side by side; then both preempted runs, preempted together.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import fault_env
from tests.slurm import slurm_harness as sh
from tests.slurm.test_e2e_train import (Run, assert_same_weights, events, launch, log_text, metrics, runs_root,
                                        steps_by_restart, until_finished)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS, SAVE_STEPS = 40, 10
SLOW_SAVE_S = 40  # > torchrun's 30 s default grace, < the partition's GraceTime (60 s)
SLOW_EXPORT_S = 25  # term-in-export's final export stalls this long: the SIGTERM lands in it (the tick may block
# for a few seconds on signal-after-marker's stop checkpoint), inside torchrun's shutdown timeout (signal_lead_s, 60 s)
# preempt-slow's steps in its first start: the preemption (SLURM acts within seconds) lands long before its
# last step, however far it runs ahead of preempt-fast, which waits at step 2 * SAVE_STEPS for its stalled write.
STEP_SLEEP_S = 0.5
# preempt-fast's write of step SAVE_STEPS stalls until the stop or this long: its run waits at the next save
# (one in flight) for at most this, well inside the GraceTime, if the preemption comes that late.
INFLIGHT_S = 20
PHASE_TIMEOUT_S = 420
URGENT_S = 5  # how long the urgent job holds the nodes
CANCEL_SETTLE_S = 15  # the cancelled job is looked at no sooner than this after the scancel


def restart0_steps(run: Run) -> int:
    return len([r for r in metrics(run.dir) if not r.get("restart")])


def cluster_nodes() -> int:
    proc = subprocess.run(["sinfo", "-h", "-N", "-p", "urgent", "-o", "%N"], capture_output=True, text=True,
                          timeout=30, check=True)
    return len(set(proc.stdout.split()))


def submit_urgent(workdir: Path) -> int:
    """A higher-tier job that needs every node to itself: SLURM preempts whatever runs there."""
    proc = subprocess.run(["sbatch", "--parsable", "-p", "urgent", "--exclusive", "-N", str(cluster_nodes()),
                           "-o", str(workdir / "urgent-%j.out"), "--wrap", f"sleep {URGENT_S}"],
                          capture_output=True, text=True, timeout=30, check=True, cwd=workdir)
    return int(proc.stdout.strip().split(";")[0])


def status_text(run: Run) -> str:
    proc = subprocess.run(["python", "-m", "launcher.cli", "status", str(run.dir)], capture_output=True,
                          text=True, timeout=60)
    return proc.stdout + proc.stderr


def fresh_stop_checkpoint(run: Run) -> bool:
    """A complete checkpoint newer than the stop request: the training answered it."""
    stop = run.dir / "STOP_REQUESTED"
    markers = (run.dir / "checkpoints").glob("step-*/COMPLETE")
    return stop.exists() and any(m.stat().st_mtime >= stop.stat().st_mtime for m in markers)


def exporting(run: Run) -> bool:
    """Rank 0 of the run's first start is in its (stalled) final export."""
    log = run.dir / "logs" / "ranks" / f"{run.job_id}-r0" / "rank-00000.log"
    return log.exists() and "fault: the export stalls" in log.read_text(errors="replace")


def phase1_tick(run: Run, facts: dict[str, object]) -> None:
    """scancel after 5 steps; USR1 while the setup lines run (the script's first seconds); USR1 after 5
    steps, then TERM once the checkpoint answering it is complete; TERM to the steps during the export."""
    done = facts.setdefault("done", set())
    if run.name in done:  # type: ignore[operator]
        return
    if run.name == "scancel" and restart0_steps(run) >= 5:
        sh.cancel(run.job_id)
        facts["cancelled_at"] = time.time()
    elif run.name == "signal-in-setup" and (run.dir / "logs" / f"{run.job_id}-r0.log").exists():
        sh.signal_batch(run.job_id)
    elif run.name == "signal-after-marker" and restart0_steps(run) >= 5:
        sh.signal_batch(run.job_id)
        sh.wait_until(lambda: fresh_stop_checkpoint(run), 60, "the stop checkpoint", interval=0.05)
        sh.signal_batch(run.job_id, "TERM")
    elif run.name == "term-in-export" and exporting(run):
        sh.signal_steps(run.job_id, "TERM")
    else:
        return
    done.add(run.name)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, object]]:
    root = runs_root("sft-preempt-")
    common = ("--max_steps", str(STEPS), "--save_steps", str(SAVE_STEPS), "--set", "train.async_save=true")
    started: list[Run] = []
    facts: dict[str, object] = {"root": root}
    try:
        # Phase 1: the uninterrupted baseline; a run that a plain scancel ends after a few steps; a
        # signal at each point of the batch script; a controller that refuses the first requeues.
        started += [launch("baseline", root, "cpu", *common),
                    launch("scancel", root, "cpu", "--max_steps", "100000", "--save_steps", "50"),
                    launch("signal-in-setup", root, "cpu-slow-setup", *common),
                    # Its batch shell's `scontrol requeue` fails twice first (tests/slurm/flaky_scontrol.sh).
                    launch("signal-after-marker", root, "cpu-flaky-scontrol", *common),
                    launch("term-in-export", root, "cpu", *common,
                           env=fault_env(dict(os.environ), slow_export_s=SLOW_EXPORT_S))]
        until_finished(started, lambda run: phase1_tick(run, facts), PHASE_TIMEOUT_S, interval_s=0.2)
        # A requeue would have made the cancelled job pending again 15 s after the scancel (the signal
        # runs usually outlast it by far: then nothing is left to wait).
        time.sleep(max(0.0, float(facts.get("cancelled_at", 0)) + CANCEL_SETTLE_S - time.time()))
        facts["scancel_after"] = sh.show_job(started[1].job_id)

        # Phase 2: both runs preempted together by one urgent job, at a random step.
        slow_env = fault_env(dict(os.environ), slow_stop_save_s=SLOW_SAVE_S, step_sleep_s=STEP_SLEEP_S)
        # preempt-fast: its asynchronous write of step SAVE_STEPS stays in flight until the stop (tests/faults),
        # and the preemption comes after that step: the stop-save must finish that write, not start another.
        inflight_env = fault_env(dict(os.environ), slow_save_step=SAVE_STEPS, slow_save_s=INFLIGHT_S)
        phase2 = [launch("preempt-fast", root, "cpu", *common, env=inflight_env),
                  # No periodic checkpoint to answer its stop (a recent one would, train/engine/checkpoint.py's
                  # stop_save): the slow stop-save always runs.
                  launch("preempt-slow", root, "cpu", *common, "--save_steps", str(10 * STEPS), env=slow_env)]
        started += phase2
        at_step = random.randint(SAVE_STEPS + 1, 2 * SAVE_STEPS - 3)
        facts["at_step"] = at_step

        def preempt_at_random_step(run: Run) -> None:
            # At the random step; earlier if the leading run nears its end (on a loaded machine the two runs
            # drift apart, and a run that finished its steps first would leave no stop-save to check).
            progress = [restart0_steps(r) for r in phase2]
            due = min(progress) >= at_step or (min(progress) >= 1 and max(progress) >= STEPS - SAVE_STEPS)
            if "urgent" not in facts and due:
                facts["urgent"] = submit_urgent(root)
                facts["preempted_at"] = time.time()
        until_finished(phase2, preempt_at_random_step, PHASE_TIMEOUT_S, interval_s=0.1)
        if "urgent" in facts:
            facts["urgent_job"] = sh.wait_state(int(facts["urgent"]), sh.FINISHED_STATES, timeout=60)  # type: ignore[arg-type]
    finally:
        for run in started:
            if not run.job:
                sh.cancel(run.job_id)
        if "urgent" in facts:
            sh.cancel(int(facts["urgent"]))  # type: ignore[arg-type]
    yield {"runs": {run.name: run for run in started}, **facts}


def _epoch(iso: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(iso).timestamp()


def assert_preempted_and_back_bitwise(run: Run, baseline: Run, facts: dict[str, object]) -> float:
    """Requeued once by its own batch shell after SLURM's preemption, resumed from the checkpoint it
    wrote then, finished bitwise; returns the seconds from the urgent submission to the requeue."""
    state = f"{run.name}: {run.job.get('JobState')} exit {run.job.get('ExitCode')} restarts {run.job.get('Restarts')}"
    assert "urgent" in facts, f"the urgent job was never submitted (step {facts.get('at_step')} not reached)"
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "1", state
    (requeue,) = events(run, "requeue")
    assert requeue["kind"] == "preemption" and "by" not in requeue, requeue
    assert "preemption (SLURM reports PreemptTime" in log_text(run, 0)
    assert_resumed_from_the_stop_save(run)
    assert "resumed from" in log_text(run, 1)
    assert_same_weights(run, baseline)
    assert facts["urgent_job"]["JobState"] == "COMPLETED"  # type: ignore[index]
    assert "preemptions 1" in status_text(run)
    return _epoch(requeue["time"]) - float(facts["preempted_at"])  # type: ignore[arg-type]


def assert_resumed_from_the_stop_save(run: Run) -> None:
    """The stop-save saved the last step, or finished the save in flight, or named a recent complete one
    instead (train/engine/checkpoint.py Checkpointer.stop_save): the restart goes on from there."""
    steps = steps_by_restart(run.dir)
    resumed = steps[1][0] - 1
    answered = resumed == steps[0][-1] or any(
        words in log_text(run, 0) for words in (f"stop: finishing the checkpoint of step {resumed} in flight",
                                                f"stop: step-{resumed:08d} answers it"))
    assert answered, f"the stop-save did not answer the stop: {steps[0][-1]} -> {steps[1]}"


def test_real_preemption_during_an_async_write_finishes_it_and_comes_back_bitwise(runs):
    run = runs["runs"]["preempt-fast"]
    seconds = assert_preempted_and_back_bitwise(run, runs["runs"]["baseline"], runs)
    # The stop came during the write of step SAVE_STEPS: seen at a step boundary while the write went on, or
    # while the next periodic save waited for it (the write outlasts the steps up to that save).
    inflight = re.search(r"stop: (?:finishing the checkpoint of step (\d+) in flight|the checkpoint of step (\d+), "
                         r"in flight when the stop came, is finished)", log_text(run, 0))
    assert inflight, "the preemption found no asynchronous write in flight"
    assert int(inflight[1] or inflight[2]) == SAVE_STEPS, inflight[0]
    assert steps_by_restart(run.dir)[1][0] in (SAVE_STEPS + 1, 2 * SAVE_STEPS + 1)  # from that write, or a save after it
    print(f"\npreempt-fast: preempted at step >= {runs['at_step']}; requeued {seconds:.0f} s after the urgent job")


def test_real_preemption_with_a_save_slower_than_torchruns_30_s_is_not_lost(runs):
    run = runs["runs"]["preempt-slow"]
    seconds = assert_preempted_and_back_bitwise(run, runs["runs"]["baseline"], runs)
    assert seconds >= SLOW_SAVE_S, f"requeued {seconds:.0f} s after the preemption: the {SLOW_SAVE_S} s save did not run"
    launcher_logs = "".join(p.read_text() for p in (run.dir / "logs" / "ranks").glob("*-r0/launcher-*.log"))
    assert "SIGKILL" not in launcher_logs, launcher_logs[-2000:]
    print(f"\npreempt-slow: {SLOW_SAVE_S} s save under SIGTERM; requeued {seconds:.0f} s after the urgent job")


def test_plain_scancel_stays_cancelled_and_status_says_so(runs):
    run = runs["runs"]["scancel"]
    assert "cancelled_at" in runs, "the run never reached step 5"
    after = runs["scancel_after"]
    assert after["JobState"] == "CANCELLED" and after["Restarts"] == "0", after
    assert not events(run, "requeue"), events(run, "requeue")
    # The batch shell outlived the SIGTERM (its poll's `sleep` dies of it): no failure of its own.
    assert not (run.dir / "logs" / "batch_failures.txt").exists(), (run.dir / "logs" / "batch_failures.txt").read_text()
    assert "CANCELLED" in status_text(run)
    finishes = events(run, "finish")
    assert not finishes or finishes[-1].get("outcome") == "cancelled", finishes


def test_sigterm_during_the_final_export_finishes_the_run_without_a_requeue(runs):
    run, baseline = runs["runs"]["term-in-export"], runs["runs"]["baseline"]
    assert "term-in-export" in runs["done"], "the run never reached its export"  # type: ignore[operator]
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "0", run.job
    assert not events(run, "requeue"), events(run, "requeue")
    log = log_text(run, 0)
    assert "training finished (FINISHED written) although its launcher exited with" in log, log[-2000:]
    assert json.loads((run.dir / "FINISHED").read_text()) == {"step": STEPS}
    assert steps_by_restart(run.dir) == {0: list(range(1, STEPS + 1))}
    assert_same_weights(run, baseline)


def test_usr1_during_the_setup_lines_requeues_without_starting_training(runs):
    run, baseline = runs["runs"]["signal-in-setup"], runs["runs"]["baseline"]
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "1", run.job
    assert "SIGUSR1 before training started; not starting it" in log_text(run, 0)
    assert 0 not in steps_by_restart(run.dir), "training ran in the attempt that was stopped during setup"
    assert [e.get("kind") for e in events(run, "requeue")] == ["preemption"]
    assert_same_weights(run, baseline)


def test_sigterm_after_the_stop_checkpoint_does_not_undo_it(runs):
    run, baseline = runs["runs"]["signal-after-marker"], runs["runs"]["baseline"]
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "1", run.job
    assert [e.get("kind") for e in events(run, "requeue")] == ["preemption"]
    assert_resumed_from_the_stop_save(run)
    assert_same_weights(run, baseline)


def test_a_controller_refusing_requeue_twice_is_retried(runs):
    run = runs["runs"]["signal-after-marker"]
    assert run.job.get("JobState") == "COMPLETED" and run.job.get("Restarts") == "1", run.job
    log = log_text(run, 0)
    assert log.count("sft-launch: scontrol requeue") == 2 and "failed; trying again" in log, log[-2000:]
