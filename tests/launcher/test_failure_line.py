"""A failed run says why in one line (contract/failure.py): the first error of the rank that failed first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contract import failure
from launcher.ops.status import failure_line
from tests.launcher.conftest import REPO, cli_env, write_run

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()


def _write(run_dir: Path, *records: dict) -> None:
    path = run_dir / failure.FAILURES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "{cut by a cra")


def test_the_cause_is_the_earliest_record_that_is_not_a_follow_on(tmp_path: Path) -> None:
    _write(tmp_path,
           {"time": 50.0, "rank": 0, "host": "n1", "exit_code": 2, "message": "an older attempt"},
           {"time": 100.0, "rank": 1, "host": "n2", "exit_code": 1, "follow_on": True, "message": "cache missing"},
           {"time": 101.0, "rank": 0, "host": "n1", "exit_code": 2, "message": "bad.jsonl:7: invalid JSON"},
           {"time": 102.0, "rank": 3, "host": "n2", "exit_code": 1, "message": "RuntimeError: gloo timeout"})
    record = failure.first_failure(tmp_path, since=99.0)
    assert failure.describe(record) == "rank 0 (n1): bad.jsonl:7: invalid JSON"
    assert failure.exit_code_of(record, 1) == 2
    assert failure.exit_code_of(None, 1) == 1
    run = {"events": [{"event": "start", "time": "1970-01-01T00:01:39+00:00"}]}
    assert failure_line(tmp_path, run, "FAILED") == "rank 0 (n1): bad.jsonl:7: invalid JSON"
    assert failure_line(tmp_path, run, "RUNNING") is None


def test_batch_shell_helper_prints_the_line_and_the_exit_code(tmp_path: Path) -> None:
    _write(tmp_path, {"time": 10.0, "rank": 2, "host": "n3", "exit_code": 1, "message": "OSError: disk full"})
    result = subprocess.run([sys.executable, "-m", "contract.failure", str(tmp_path), "9", "1"], capture_output=True,
                            text=True, env=cli_env(), check=True)
    assert result.stdout.strip() == "1"
    assert result.stderr.strip() == "sft-launch: error: rank 2 (n3): OSError: disk full"


@pytest.mark.slow
def test_local_run_ends_with_the_first_failing_ranks_error_and_exit_2(tmp_path: Path) -> None:
    """Data that changed after the check (as while a job waits in the queue) fails inside training:
    the terminal shows rank 0's progress, then the rank logs' directory and, last, rank 0's file:line
    error, exit 2. Rank 1's follow-on error and torchrun's traceback are in the rank logs only."""
    data, run_dir = tmp_path / "chat.jsonl", tmp_path / "run"
    data.write_text("\n".join(SAMPLE[:40]) + "\n")
    args = ["--model", "tiny", "--executor", "local", "--data", str(data), "--max_steps", "2", "--output", str(run_dir)]
    write_run(args)
    data.write_text("\n".join(SAMPLE[:6] + ['{"conversations": ['] + SAMPLE[6:40]) + "\n")
    driver = ("import sys; from launcher.commands.launch import build_parser, request_from_args; "
              "from launcher.resolve.options import resolve; from launcher.execute.local import run_local; "
              f"sys.exit(run_local(resolve(request_from_args(build_parser().parse_args({args!r})))))")
    result = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=300)
    terminal = result.stdout.strip().splitlines()
    last = terminal[-1]
    assert result.returncode == 2, result.stdout[-4000:]
    assert last.startswith("sft-launch: error: rank 0 (") and f"{data}:7: invalid JSON" in last, terminal
    [rank_logs] = (run_dir / "logs" / "ranks").iterdir()
    assert terminal[-2] == f"sft-launch: every rank's output: {rank_logs}/", terminal
    assert "[rank 0] INFO train.engine.model: rank 0 of 2" in result.stdout, "rank 0's progress reaches the terminal"
    for elsewhere in ("Traceback", "ChildFailedError", "[rank 1]", "tokenized cache missing", "error: "):
        assert elsewhere not in "\n".join(terminal[:-2]), (elsewhere, terminal)
    ranks = {path.name: path.read_text() for path in rank_logs.iterdir()}
    assert f"{data}:7: invalid JSON" in ranks["rank-00000.log"]
    assert "[rank 1] ERROR train:" in ranks["rank-00001.log"] and "tokenized cache missing" in ranks["rank-00001.log"]
    [launcher_log] = [text for name, text in ranks.items() if name.startswith("launcher-")]
    assert "ChildFailedError" in launcher_log and "Traceback" in launcher_log, launcher_log
    records = failure.read_failures(run_dir)
    assert any(r["rank"] == 0 and r["exit_code"] == 2 for r in records), records
    assert all(r.get("follow_on") for r in records if r["rank"] != 0), records


def test_a_package_missing_on_the_compute_node_is_the_one_line(tmp_path: Path) -> None:
    """`import datasets` failing inside training (a node's environment lacks it) is recorded like any
    other first failure, not left to torchrun's traceback."""
    run_dir, stubs = tmp_path / "run", tmp_path / "stubs"
    write_run(["--model", "tiny", "--executor", "local", "--output", str(run_dir)])
    (stubs / "datasets").mkdir(parents=True)
    (stubs / "datasets" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'datasets'\", name='datasets')\n")
    env = cli_env()
    env["PYTHONPATH"] = os.pathsep.join([str(stubs), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, "-m", "train", "--config", str(run_dir / "train.toml")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    [record] = failure.read_failures(run_dir)
    assert record["message"] == "ModuleNotFoundError: No module named 'datasets'"
