"""CLI latency: median wall time of `sft-launch --help` and `--dry-run` over N subprocess runs.

Targets (issue #2): --help <= 0.2 s, --dry-run <= 0.5 s.
Usage: python -m bench.suites.cli_latency [-n 7] [--results bench/results/cpu]
Runs `python -m launcher.cli` from the checkout (same code path as the console script) with sbatch
kept off PATH, so the number measures sft-launch, not the SLURM controller. With --results it writes
cli-latency.json through bench/report/results_io.py: every run's time, the machine (CPU model, cores, load
average before and after: a shared machine's load shows in these numbers) and no GPU.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `python bench/suites/cli_latency.py` as well as `python -m bench.suites.cli_latency`
    sys.path.insert(0, str(REPO))
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
    parser.add_argument("--results", type=Path, default=None, help="folder for cli-latency.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        commands = {
            "--help": ["--help"],
            "--dry-run": ["--cluster", str(REPO / "cluster.example.toml"), "--profile", "a100", "--model", "llama3-8b",
                          "--nodes", "2", "--dry-run", "--output", str(work / "run"),
                          "--force"],  # the disk check still runs; /tmp holds no 8B run's checkpoints
        }
        python_start = [_timed([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
        rows = [latency_row(name, time_command(command, args.runs, work)) for name, command in commands.items()]
    record = {"machine": machine(load_before), "runs": args.runs, "python_start_s": python_start, "rows": rows}
    print(f"{'command':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'target s':>9}  ok")
    for row in rows:
        print(f"{row['command']:<12} {row['median_s']:>9.3f} {min(row['times_s']):>7.3f} {max(row['times_s']):>7.3f} "
              f"{row['target_s']:>9.1f}  {'yes' if row['met'] else 'NO'}")
    print(f"(bare `python -c pass` start-up: {statistics.median(python_start):.3f} s; {args.runs} runs each; "
          f"load average {record['machine']['load_avg_1m_before']:.1f} before, "
          f"{record['machine']['load_avg_1m_after']:.1f} after, {record['machine']['cores']} cores)")
    if args.results:
        from bench.report.results_io import write_result

        write_result(args.results / "cli-latency.json", record)
    return 0 if all(row["met"] for row in rows) else 1


def latency_row(name: str, times: list[float]) -> dict:
    """One command's times and its verdict (the median against the target)."""
    median = statistics.median(times)
    return {"command": name, "times_s": times, "median_s": median, "target_s": TARGETS_S[name],
            "met": median <= TARGETS_S[name]}


def machine(load_before: float) -> dict:
    """The CPU the times were taken on, and how loaded the machine was (load average over 1 minute)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return {"cpu": names[0] if names else platform.processor(), "cores": len(os.sched_getaffinity(0)), "gpu": "none",
            "load_avg_1m_before": load_before, "load_avg_1m_after": os.getloadavg()[0]}


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    sys.exit(main())
