"""Room on disk is checked before the queue: the run's checkpoints, export and cache against real file systems."""

from __future__ import annotations

from pathlib import Path

from tests.filesystems import tmpfs
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli

TINY = ["--model", "tiny", "--executor", "local"]


def _cli(args: list[str], cwd: Path):  # type: ignore[no-untyped-def]
    return run_cli(args, cwd, env=cli_env(PATH=path_without("sbatch")))


def test_an_8b_launch_into_a_64_mb_file_system_is_refused_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    small = tmp_path / "small"
    with tmpfs(small, "64m"):
        result = _cli(["--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100", "--model", "llama3-8b", "--dry-run",
                       "--output", str(small / "run")], tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("sft-launch: error: disk: the run needs ~") and f"on {small} (" in line, line
        assert "checkpoints " in line and "export " in line and "bytes needed, " in line and " free)" in line, line
        assert not (small / "run").exists()


def test_plan_shows_the_disk_line_and_warns_under_20_percent_to_spare(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with tmpfs(disk, "64m") as resize:
        roomy = _cli(["plan", *TINY, "--output", str(disk / "run")], tmp_path)
        assert roomy.returncode == 0, roomy.stderr
        (line,) = [line for line in roomy.stdout.splitlines() if line.startswith("Disk ")]
        assert f"on {disk} (checkpoints " in line and "export " in line and "cache " in line, line
        assert "disk:" not in roomy.stdout  # room to spare: no warning
        needed_mb = float(line.split("~")[1].split(" MB")[0])
        resize(f"{int(needed_mb * 1.1 * 1e6)}")  # room for it, but under 20% to spare
        tight = _cli(["plan", *TINY, "--output", str(disk / "run")], tmp_path)
        assert tight.returncode == 0 and "Warning disk: under 20% to spare: the run needs ~" in tight.stdout, tight.stdout
        resize("1m")
        full = _cli([*TINY, "--dry-run", "--output", str(disk / "run")], tmp_path)
        assert full.returncode == 2 and "disk: the run needs" in full.stderr, full.stderr
        forced = _cli([*TINY, "--dry-run", "--force", "--output", str(disk / "run")], tmp_path)
        assert forced.returncode == 0, forced.stderr  # --force launches anyway, as for memory


def test_what_a_resumed_run_already_holds_counts_as_room(tmp_path: Path) -> None:
    from launcher.resolve.storage import run_writes

    disk = tmp_path / "disk"
    with tmpfs(disk, "4m"):
        run = disk / "run"
        (run / "checkpoints" / "step-00000004").mkdir(parents=True)
        (run / "checkpoints" / "step-00000004" / "model.bin").write_bytes(b"\0" * 3_000_000)
        (fs,) = run_writes(run, "checkpoints", "export", "", {"checkpoints": 3_500_000, "export": 0, "cache": 0})
        assert fs.mount == str(disk) and fs.held == 3_000_000
        assert fs.free < 1_200_000 and fs.room >= 3_500_000  # fits only because the old one is replaced


def test_plan_says_a_launch_would_refuse_a_run_the_disk_cannot_hold(tmp_path: Path) -> None:
    """As for memory (DOES NOT FIT, exit 3): the plan names the refusal a launch would make, and why."""
    from launcher.commands.plan_cmd import EXIT_DOES_NOT_FIT

    full = tmp_path / "full"
    with tmpfs(full, "1m"):
        result = _cli(["plan", *TINY, "--output", str(full / "run")], tmp_path)
        assert result.returncode == EXIT_DOES_NOT_FIT, result.stdout + result.stderr
        (line,) = [line for line in result.stdout.splitlines() if "would refuse" in line]
        assert "DOES NOT FIT" in line and f"on {full}" in line and "--force" in line, line
        assert not (full / "run").exists()
