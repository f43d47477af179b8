"""On the real cluster: a job that fails inside training ends its log with one line, the first error
of the rank that failed first, exits 2 for a data error, and `sft-launch status` shows the same line.

The data changes between the login-node check and the job's start (as it may while a job waits in
the queue): `sft-launch --dry-run` checks, the run directory is rendered, then the file is corrupted and the run
directory is submitted the way `sft-launch` submits it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.launcher.conftest import write_run
from tests.slurm import slurm_harness as sh

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

HERE = Path(__file__).parent
SAMPLE = (HERE.parents[1] / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()


def test_failed_job_says_why_in_one_line() -> None:
    sh.require_cluster()
    root = Path(tempfile.mkdtemp(prefix="sft-fail-", dir=os.environ.get("SFT_SLURM_DIR", "/tmp")))
    data, run_dir = root / "chat.jsonl", root / "run"
    data.write_text("\n".join(SAMPLE[:40]) + "\n")
    env = {**os.environ, "SFT_SLURM_TESTS": str(HERE)}
    cli = [sys.executable, "-m", "launcher.cli"]
    rendered = subprocess.run([*cli, "--cluster", str(HERE / "cluster.toml"), "--nodes", "2", "--model", "tiny",
                               "--data", str(data), "--max_steps", "2", "--output", str(run_dir), "--dry-run"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    write_run(["--cluster", str(HERE / "cluster.toml"), "--nodes", "2", "--model", "tiny", "--data", str(data),
               "--max_steps", "2", "--output", str(run_dir)])  # a dry run checks but writes no run directory
    data.write_text("\n".join(SAMPLE[:6] + ['{"conversations": ['] + SAMPLE[6:40]) + "\n")
    submit = ("import sys; from pathlib import Path; from launcher.execute import sbatch; "
              "from launcher.execute.render import record_submission; d = Path(sys.argv[1]); "
              "j = sbatch.submit(d); record_submission(d, j); print(j)")
    job_id = int(subprocess.run([sys.executable, "-c", submit, str(run_dir)], capture_output=True, text=True,
                                env=env, check=True, timeout=60).stdout.strip())
    try:
        fields = sh.wait_all_finished([job_id], timeout=300)[job_id]
    finally:
        if sh.show_job(job_id).get("JobState") not in sh.FINISHED_STATES:
            sh.cancel(job_id)
    assert fields.get("JobState") == "FAILED" and fields.get("ExitCode") == "2:0", fields
    log = (run_dir / "logs" / f"{job_id}-r0.log").read_text(errors="replace").strip().splitlines()
    expected = f"{data}:7: invalid JSON"
    assert log[-1].startswith("sft-launch: error: rank 0 (") and expected in log[-1], log[-10:]
    status = subprocess.run([*cli, "status", str(run_dir), "--json"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert expected in json.loads(status.stdout)["error"], status.stdout + status.stderr
