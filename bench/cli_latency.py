"""CLI latency: median wall time of `sft-launch --help` and `--dry-run` over N subprocess runs.

Targets (issue #2): --help <= 0.2 s, --dry-run <= 0.5 s. Usage: python bench/cli_latency.py [-n 7]
Runs `python -m launcher.cli` from the checkout (same code path as the console script) with sbatch
kept off PATH, so the number measures sft-launch, not the SLURM controller.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS_S = {"--help": 0.2, "--dry-run": 0.5}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "sbatch").exists())
    return env


def time_command(args: list[str], runs: int, cwd: Path) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=_env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        commands = {
            "--help": ["--help"],
            "--dry-run": ["--cluster", str(REPO / "cluster.example.toml"), "--profile", "a100", "--model", "llama3-8b",
                          "--nodes", "2", "--dry-run", "--output", str(work / "run"),
                          "--force"],  # the disk check still runs; /tmp holds no 8B run's checkpoints
        }
        python_start = statistics.median(
            _timed([sys.executable, "-c", "pass"]) for _ in range(args.runs))
        print(f"{'command':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'target s':>9}  ok")
        ok = True
        for name, command in commands.items():
            times = time_command(command, args.runs, work)
            median = statistics.median(times)
            passed = median <= TARGETS_S[name]
            ok &= passed
            print(f"{name:<12} {median:>9.3f} {min(times):>7.3f} {max(times):>7.3f} {TARGETS_S[name]:>9.1f}  "
                  f"{'yes' if passed else 'NO'}")
        print(f"(bare `python -c pass` start-up: {python_start:.3f} s; {args.runs} runs each)")
    return 0 if ok else 1


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
