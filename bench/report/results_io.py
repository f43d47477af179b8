"""The one writer of bench/results files, and the numbers every results file is checked against.

Every bench script writes its JSON through `write_result`, which adds a `provenance` block: the git
commit (and whether the tree had uncommitted changes; where the tree was copied, without .git or with
a .git that lags the copied files, the commit comes from $BENCH_COMMIT and `dirty` is null), the exact
command, the date, the GPU(s) and driver, and the versions of torch/transformers/accelerate/peft/
deepspeed. A results file is never edited afterwards: tests/bench/test_results.py re-derives the
derived numbers of every committed file (MFU, TFLOP/s, ratios to the named peer, token counts) from
its raw fields with the functions below and fails on any difference beyond rounding.

Raw fields of a one-GPU throughput run (`single-*.json`): `real_tokens` counted after
`warmup_steps` skipped optimizer steps, `seconds` of wall time over those steps (training steps
only: no model build, no teardown), `steps`, `gpu_count`, `peak_flops` (dense bf16 FLOP/s per GPU
used for MFU), `docs` and `budget` (which fix the synthetic documents, bench/common/synthetic.py).

Each training run of ours that the planner can express (bench/report/speed_inputs.py: one-GPU variants,
compare-*, bench/multi's blocks, the 70B LoRA/QLoRA runs, long context) also records, in its block, the plan's
`predicted_tokens_per_s_per_gpu` for its setting (launcher/plan/speed.py at the commit that wrote it) and
`speed_error` = predicted / measured - 1 (issue #55); other kinds are written as given.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.common.synthetic import attended_length
from bench.report.speed_inputs import with_predictions
from contract.shape import ModelShape

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PACKAGES = ("torch", "transformers", "accelerate", "peft", "deepspeed", "trl", "liger-kernel", "flash-attn-4",
            "quack-kernels")
PROVENANCE_KEYS = ("commit", "dirty", "command", "python", "date_utc", "gpus", "gpu_count", "driver", "versions")
# Optimizer steps every side of a comparison skips before its clock starts (CUDA context,
# torch.compile, allocator warm-up): the same number for ours and for every peer.
WARMUP_STEPS = 4


def clock_start(logged_steps: Iterable[int]) -> int:
    """The logged step a run's clock starts at: the first at or past WARMUP_STEPS. A run that logs every
    N > 1 steps (train.logging_steps) ends its warm-up at a window's end: logging every 10 steps, at step 10."""
    return min((step for step in logged_steps if step >= WARMUP_STEPS), default=WARMUP_STEPS)


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _gpus() -> tuple[list[str], str]:
    """Names of the visible GPUs and the NVIDIA driver version ([] and "" without CUDA)."""
    try:
        import torch
    except ImportError:
        return [], ""
    if not torch.cuda.is_available():
        return [], ""
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    proc = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)
    return names, (proc.stdout.splitlines() or [""])[0].strip()


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance() -> dict[str, Any]:
    """Where a result comes from: code, command, machine, software, time."""
    gpus, driver = _gpus()
    # Only this tree's own repository: a copy inside another checkout (git-ignored there, as on a lent GPU
    # machine) would otherwise record that checkout's HEAD and dirtiness.
    top = _git("rev-parse", "--show-toplevel")
    commit = _git("rev-parse", "HEAD") if top and Path(top).resolve() == ROOT else ""
    # A copy of the tree without .git (a lent GPU machine): the caller names the commit it copied.
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no")) if commit else None
    declared = os.environ.get("BENCH_COMMIT", "")
    if declared and declared != commit:  # a copy whose .git lags its files (seen on lent GPU machines)
        commit, dirty = declared, None
    return {
        "commit": commit, "dirty": dirty,
        "command": list(sys.argv), "python": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpus": gpus, "gpu_count": len(gpus), "driver": driver, "versions": _versions(),
    }


def write_result(path: Path, record: dict[str, Any]) -> Path:
    """Write one results file (the record, the plan's prediction of each training run of ours in it, its
    provenance); the only writer of bench/results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    origin = provenance()
    predicted = with_predictions(path.name, {**record, "provenance": origin})
    predicted.pop("provenance")
    path.write_text(json.dumps({**predicted, "provenance": origin}, indent=1) + "\n")
    return path


# --------------------------------------------------------------------------- derived numbers


def throughput_numbers(arch: dict[str, Any], lengths: list[int], real_tokens_per_s: float, gpu_count: int,
                       peak_flops: float | None, lora_params: int | None = None) -> dict[str, Any]:
    """TFLOP/s per GPU and MFU of `real_tokens_per_s` (all GPUs together) on a model of shape `arch`, by
    contract.shape's FLOP count: 6·N + 6·L·a·s̄, or with LoRA adapters (`lora_params`, recorded in the file)
    4·N + 6·N_lora + 6·L·a·s̄; both sides of a LoRA comparison are counted alike."""
    per_gpu = real_tokens_per_s / gpu_count
    flops_per_token = ModelShape.from_arch(arch).flops_per_token(attended_length(lengths), lora_params)
    tflops = flops_per_token * per_gpu / 1e12
    return {"flops_per_token": flops_per_token, "tflops_per_gpu": tflops,
            "mfu": tflops * 1e12 / peak_flops if peak_flops else None}
