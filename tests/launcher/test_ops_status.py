"""status / runs on hand-built run directories; SLURM answers come from a stand-in query."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.launcher.ops_fixtures import make_run

from launcher.ops import runs, status

REPO = Path(__file__).resolve().parents[2]


def running(job_id: str) -> dict[str, str]:
    return {"JobId": job_id, "JobState": "RUNNING", "Reason": "None", "Restarts": "1"}


def forgotten(_job_id: str) -> None:
    return None


def test_status_of_a_running_requeued_run(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    result = status.run_status(run_dir, running)
    assert result["state"] == "RUNNING" and result["state_source"] == "slurm"
    assert result["job_ids"] == ["900042"] and result["restarts"] == 1 and result["slurm_restarts"] == 1
    assert (result["preemptions"], result["timeouts"], result["max_timeouts"]) == (1, 0, 3)
    assert result["last_checkpoint"]["step"] == 18  # step-20 has no COMPLETE marker
    assert result["step"] == 18 and result["total_steps"] == 40
    assert result["loss"] == pytest.approx(6.0 - 0.05 * 18)
    assert result["seconds_per_step"] == pytest.approx(2.0)  # from the newest restart only
    assert result["eta_s"] == pytest.approx((40 - 18) * 2.0)
    assert result["mfu"] is None
    text = status.format_status(result)
    assert "RUNNING" in text and "step 18 (" in text and "18/40" in text and "MFU n/a" in text
    assert "preemptions 1, time-limit hits 0/3" in text and "eta          0m44s" in text


def test_status_falls_back_to_run_json_when_slurm_forgot_the_job(tmp_path: Path) -> None:
    done = status.run_status(make_run(tmp_path, "done", finished=True), forgotten)
    assert done["state"] == "COMPLETED" and done["state_source"] == "run.json" and done["eta_s"] is None
    requeued = status.run_status(make_run(tmp_path, "req", steps_per_restart=(5,), kinds=("timeout",)), forgotten)
    assert requeued["state"].startswith("REQUEUED") and requeued["timeouts"] == 1


# `sacct -X -n -P -j JOB -o JobID,State,ExitCode,Reason` as SLURM 22.05 prints it (with accounting)
SACCT_CANCELLED = "900042|CANCELLED by 0|0:15|None\n"
SACCT_FAILED = "900042|FAILED|1:0|NonZeroExitCode\n"
SACCT_REQUEUED_THEN_DONE = "900042|REQUEUED|0:0|None\n900042|COMPLETED|0:0|None\n"  # with -D


def test_sacct_output_is_read() -> None:
    from launcher.ops.slurm import parse_sacct

    assert parse_sacct(SACCT_CANCELLED) == {"JobState": "CANCELLED", "ExitCode": "0:15", "Reason": "None"}
    assert parse_sacct(SACCT_FAILED)["JobState"] == "FAILED"
    assert parse_sacct(SACCT_REQUEUED_THEN_DONE)["JobState"] == "COMPLETED"
    assert parse_sacct("") is None and parse_sacct("sacct: error: Slurm accounting storage is disabled\n") is None


def test_status_asks_accounting_for_a_job_slurmctld_forgot(tmp_path: Path) -> None:
    """run.json says the batch shell saw a requeue; accounting knows the job was cancelled after it."""
    from launcher.ops.slurm import parse_sacct

    run_dir = make_run(tmp_path, "req", steps_per_restart=(5,), kinds=("timeout",))
    cancelled = status.run_status(run_dir, forgotten, lambda _job: parse_sacct(SACCT_CANCELLED))
    assert cancelled["state"] == "CANCELLED" and cancelled["state_source"] == "sacct"
    failed = status.run_status(run_dir, forgotten, lambda _job: parse_sacct(SACCT_FAILED))
    assert "FAILED (NonZeroExitCode)" in status.format_status(failed)
    no_accounting = status.run_status(run_dir, forgotten, forgotten)
    assert no_accounting["state"].startswith("REQUEUED") and no_accounting["state_source"] == "run.json"


def test_status_total_steps_from_the_metrics_when_max_steps_unset(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, max_steps=40)
    (run_dir / "train.toml").write_text("[train]\nnum_train_epochs = 2.0\n")
    assert status.run_status(run_dir, running)["total_steps"] == 40  # "total_steps": 40 in metrics.jsonl


def test_status_json_and_unknown_run_through_the_cli(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, finished=True)
    cli = [sys.executable, "-m", "launcher.cli"]
    proc = subprocess.run([*cli, "status", str(run_dir), "--json"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["step"] == 18
    proc = subprocess.run([*cli, "status", "nope", "--root", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "RUN nope" in proc.stderr
    by_name = subprocess.run([*cli, "status", "run-a", "--root", str(tmp_path)], capture_output=True, text=True,
                             cwd=REPO)
    assert by_name.returncode == 0 and "run-a" in by_name.stdout


def test_runs_lists_every_run_under_the_root(tmp_path: Path) -> None:
    make_run(tmp_path, "alpha", finished=True)
    make_run(tmp_path, "beta", job_id="900043", steps_per_restart=(3,), kinds=())
    (tmp_path / "not-a-run").mkdir()
    listed = runs.list_runs(tmp_path)
    assert {r["name"] for r in listed} == {"alpha", "beta"}
    text = runs.format_runs(listed)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["NAME", "STATE", "STEP", "LOSS"] and len(lines) == 3
    alpha = next(line for line in lines if line.startswith("alpha"))
    assert "18/40" in alpha and f"{6.0 - 0.05 * 18:.4f}" in alpha


def test_runs_lists_the_others_when_one_run_json_is_broken(tmp_path: Path) -> None:
    """One run.json cut short must not hide every other run of the storage root behind one error line."""
    make_run(tmp_path, "alpha", finished=True)
    broken = make_run(tmp_path, "broken", job_id="900043", finished=True)
    (broken / "run.json").write_text('{"job_ids": [\n')
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "runs", "--root", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert set(rows) == {"alpha", "broken"} and "run.json:2: not valid JSON" in rows["broken"], proc.stdout


def test_runs_cli_with_an_empty_root(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "runs", "--root", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0 and "no runs under" in proc.stdout


def test_status_shows_excluded_nodes_and_counts_node_failures_apart(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, "nodes", steps_per_restart=(5, 5, 5), kinds=("preemption", "node-failure"))
    (run_dir / "logs" / "node_failures.txt").write_text("900042 1 node2 rank 1 on node2 died without a failure record\n")
    result = status.run_status(run_dir, running)
    assert (result["restarts"], result["preemptions"], result["node_failures"]) == (2, 1, 1)
    assert result["excluded_nodes"] == [{"job": "900042", "restart": "1", "node": "node2",
                                         "reason": "rank 1 on node2 died without a failure record"}]
    text = status.format_status(result)
    assert "preemptions 1, time-limit hits 0/3, node failures 1)" in text
    assert "excluded     node2: rank 1 on node2 died without a failure record (job 900042, restart 1)" in text


def test_status_shows_the_experts_load_of_an_moe_run_and_nothing_for_a_dense_one(tmp_path: Path) -> None:
    from tests.launcher.ops_fixtures import step_record

    run_dir = make_run(tmp_path)
    assert "experts" not in status.run_status(run_dir, running)
    moe = {**step_record(19, 1, elapsed=20.0, mfu=None, total_steps=40), "aux_loss": 1.0213,
           "expert_load_min": [0.1, 0.05], "expert_load_max": [0.3, 0.41]}
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()[:-1]) + json.dumps(moe) + "\n")
    result = status.run_status(run_dir, running)
    assert result["experts"] == {"aux_loss": 1.0213, "load_min": 0.05, "load_max": 0.41, "layer_min": 1, "layer_max": 1}
    assert "experts      load share min 0.050 (layer 1), max 0.410 (layer 1); aux loss 1.0213" in status.format_status(result)
