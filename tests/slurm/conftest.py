"""pytest glue for the real-SLURM tests: skip `slurm`-marked tests when the local cluster is not up
(fail them under $SFT_REQUIRE_SLURM_NODES, as scripts/test.sh sets it),
and a `slurm_jobs` fixture that submits scripts and cancels whatever a test leaves running."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm import slurm_harness as sh


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slurm") is not None:
        sh.require_cluster()


class SlurmJobs:
    """Submits batch scripts for one test; remembers the ids so teardown can cancel leftovers."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.job_ids: list[int] = []

    def submit_text(self, text: str, *sbatch_args: str, name: str = "job.sh") -> int:
        """Write `text` to WORKDIR/name and sbatch it from WORKDIR (output goes there by default)."""
        script = self.workdir / name
        script.write_text(text)
        script.chmod(0o755)
        return self.submit(script, *sbatch_args)

    def submit(self, script: Path, *sbatch_args: str, cwd: Path | None = None) -> int:
        job_id = sh.submit(script, *sbatch_args, cwd=cwd or self.workdir)
        self.job_ids.append(job_id)
        return job_id

    def track(self, job_id: int) -> int:
        """Cancel this job at teardown too (for jobs submitted by other tools, e.g. sft-launch)."""
        self.job_ids.append(job_id)
        return job_id

    show = staticmethod(sh.show_job)
    wait_state = staticmethod(sh.wait_state)
    wait_all_finished = staticmethod(sh.wait_all_finished)
    signal_batch = staticmethod(sh.signal_batch)

    def cancel_unfinished(self) -> None:
        for job_id in self.job_ids:
            try:
                if sh.show_job(job_id).get("JobState") not in sh.FINISHED_STATES:
                    sh.cancel(job_id)
            except sh.SlurmError:
                pass


@pytest.fixture
def slurm_jobs(tmp_path: Path):
    jobs = SlurmJobs(tmp_path)
    yield jobs
    jobs.cancel_unfinished()
