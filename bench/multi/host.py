"""How the multi-GPU benchmarks start our training (bench/multi/gpu_multi.py and its phases multi_full.py and
multi_fp8.py, gpu_multi_lora.py, gpu_qlora.py, gpu_resume.py, gpu_context_parallel.py): a run directory rendered by
`sft-launch --dry-run` with random weights, launched on one host as a 2-node job would be (2 machines x G/2
processes), and the steady-state numbers of a finished run. One place the suites import, so none imports another for
these.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common.processes import TIMED_OUT, run_machines
from bench.common.synthetic import SHAPES
from bench.report.results_io import throughput_numbers
from bench.suites.gpu_single import TINY, device_peak, steady_state

ROOT = Path(__file__).resolve().parents[2]
CPU_SMOKE = bool(os.environ.get("BENCH_CPU_SMOKE"))  # tiny shapes on CPU: proves the script end to end
DOCS, MAX_DOC_TOKENS = (300, 512) if CPU_SMOKE else (6000, 4096)


def shape(name: str) -> dict:
    return TINY if CPU_SMOKE else SHAPES[name]


def tagged(args: argparse.Namespace) -> str:
    """The suffix --tag puts on a results file and a run directory: '-<tag>', or '' without a tag."""
    return f"-{args.tag}" if args.tag else ""


def toml_inline(table: dict) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


PROFILE_TOML = """
[profiles.bench]
gpus_per_node = {gpn}
processes_per_node = {ppn}
gpu_type = "{gpu_type}"
backend = "{backend}"
partition = ""
storage_root = "{root}"
strategy = "fsdp"
time = "1:00:00"
"""


def write_run_dir(argv: list[str]) -> Any:
    """The run directory a launch of `sft-launch argv` writes (a `--dry-run` renders into a temporary
    directory and leaves it untouched); returns the resolved Launch."""
    from launcher.commands.launch import build_parser, request_from_args
    from launcher.execute import render
    from launcher.resolve.options import resolve

    launch = resolve(request_from_args(build_parser().parse_args(argv)))
    render.write_run_dir(launch, ["sft-launch", *argv])
    return launch


def random_weights(arch: dict, sharded: bool = False) -> list[str]:
    """`--set` flags for a run with random weights of shape `arch` (no checkpoint, the shipped tokenizer);
    `sharded`: drawn per shard on the GPUs (model.init = sharded: an 8B draw on every rank's CPU is slow)."""
    return ["--set", 'model.path=""', "--set", 'model.tokenizer=""', "--set", "model.arch=" + toml_inline(arch),
            *(["--set", "model.init=sharded"] if sharded else [])]


def render(run_dir: Path, model: str, data: Path, gpus: int, extra: list[str]) -> Any:
    """Render `run_dir` with `sft-launch --dry-run` (a failure ends the call); returns the resolved Launch."""
    cluster = run_dir.parent / "cluster.toml"
    per_node = max(1, gpus // 2)
    cluster.write_text(PROFILE_TOML.format(gpn=0 if CPU_SMOKE else per_node, ppn=per_node,
                                           gpu_type=os.environ.get("BENCH_GPU", "h200"), root=run_dir.parent,
                                           backend="gloo" if CPU_SMOKE else "nccl"))
    cmd = [sys.executable, "-m", "launcher.cli", "--cluster", str(cluster), "--profile", "bench", "--nodes", "2" if gpus > 1 else "1",
           "--model", model, "--data", str(data), "--output", str(run_dir), "--dry-run", "--executor", "sbatch",
           "--logging_steps", "1", "--set", "data.format=tokens", "--set", 'run.export_dir=""',
           "--set", f"model.precision={'fp32' if CPU_SMOKE else 'bf16'}", "--force", *extra]
    env = dict(os.environ)
    if CPU_SMOKE:  # keep a local SLURM controller out of it: this dry run only renders
        env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not Path(d, "sbatch").exists())
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"render failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    return write_run_dir([a for a in cmd[3:] if a != "--dry-run"])  # the dry run left the run directory untouched


def launch(run_dir: Path, gpus: int, port: int, timeout: float | None = None,
           env: dict[str, str] | None = None) -> tuple[int, str]:
    """2 machines x gpus/2 processes on this host (or 1 x 1), with os.environ updated by `env`; returns
    (exit code, combined log). A machine that fails takes the other down with it, and past `timeout` seconds
    every process of the job is killed and the code is TIMED_OUT (run_machines)."""
    machines = 2 if gpus > 1 else 1
    per = gpus // machines
    jobs = []
    for rank in range(machines):
        machine_env = {**os.environ, **(env or {})}
        if not CPU_SMOKE:
            machine_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(rank * per + i) for i in range(per))
        cmd = ["accelerate", "launch", "--config_file", str(run_dir / "accelerate.yaml"), "--num_machines",
               str(machines), "--machine_rank", str(rank), "--num_processes", str(gpus), "--main_process_ip",
               "127.0.0.1", "--main_process_port", str(port), "-m", "train", "--config", str(run_dir / "train.toml")]
        jobs.append((cmd, run_dir / f"machine{rank}.log", machine_env))
    codes = run_machines(jobs, timeout)
    text = "".join((run_dir / f"machine{r}.log").read_text() for r in range(machines))
    return (TIMED_OUT if TIMED_OUT in codes else max(codes)), text


def run_stats(run: Path, code: int, text: str, rows: list, label: str, arch: dict, gpus: int,
              lengths: list[int]) -> dict | None:
    """Steady-state throughput of a finished run: real tokens and seconds over the steps after the
    warm-up, and the MFU of that aggregate (real tokens / wall seconds, by contract.shape's FLOP
    count). The mean of the logged per-step MFUs sits beside it as `mean_step_mfu` (a stall in one
    step barely moves a mean of rates). None (and a failure row) when the run failed."""
    if code != 0:
        print(text[-4000:])
        rows.append((label, f"failed (exit {code})"))
        return None
    stats = steady_state(run / "metrics.jsonl")
    peak = device_peak()[1]
    stats.update(gpu_count=gpus, peak_flops=peak,
                 **throughput_numbers(arch, lengths, stats["real_tokens_per_s"], gpus, peak))
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    mfus = [r["mfu"] for r in records if r.get("mfu") and r["step"] > stats["warmup_steps"]]
    stats["mean_step_mfu"] = sum(mfus) / len(mfus) if mfus else None
    return stats


def save_line(text: str) -> dict | None:
    """The last 'checkpoint saved' line of a run's log as {gb, seconds, gbps} (train/engine/checkpoint.py)."""
    saved = re.findall(r"checkpoint saved: \S+ \(([\d.]+) GB in ([\d.]+) s, ([\d.]+) GB/s\)", text)
    return dict(zip(("gb", "seconds", "gbps"), map(float, saved[-1]))) if saved else None
