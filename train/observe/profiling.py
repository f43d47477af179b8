"""Opt-in kernel profile of a few optimizer steps (train.profile_steps = "8:10": steps 8 and 9, rank 0).

It leaves three things: the top kernels by GPU time in the log, a Chrome/Perfetto trace under
``<run dir>/logs/profile/``, and a breakdown of GPU time by kind of work (matmul, attention, memset,
optimizer, loss, communication, compiled elementwise, ...). Memsets and the unnamed rest are also
attributed to the operator that launched them (the trace links each kernel to its CPU op by "External
id") and to the operators enclosing that one, which is how a stray `zeros` in a kernel library, or whose
copy a copy kernel is, shows up. And each step apart: its host wall time,
the GPU's busy time, and the host's time in allocator and synchronizing calls, so a slow step beside a
fast one says whether the GPU computed more or waited; and how long no kernel but FSDP's collectives ran,
with the longest such gaps and the kernels on either side (a GPU waiting for its host at a step's start).
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

# Kernel-name fragments per kind, first match wins (lower case). cuBLAS kernels are nvjet/sm90_xmma/
# cutlass gemm; FlashAttention-4 kernels are CuTe DSL "kernel_cutlass_..._flash_attn..." names.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl",)),  # FSDP's all-gathers and reduce-scatters, on NCCL's own streams
    ("attention", ("flash", "fmha", "attn")),
    ("matmul", ("gemm", "nvjet", "xmma", "cublas", "cutlass")),
    ("memset", ("memset",)),
    ("memcpy", ("memcpy",)),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel")),
    ("loss", ("liger", "cross_entropy")),
    ("compiled elementwise", ("triton_",)),
)


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, fragments in KINDS:
        if any(fragment in lowered for fragment in fragments):
            return kind
    return "other"


STEP_LABEL = "sft optimizer step"  # each profiled step's range in the trace (torch.profiler.record_function)
CALLERS_SHOWN = 3  # enclosing operators named after a launching one: whose copy it is, not only that it is one
RANGE_CATEGORIES = ("cpu_op", "user_annotation")  # host ranges that nest: operators, record_function labels
MODULE_SUFFIX = re.compile(r" \(.*\)$")  # "FSDP::all_gather (model.layers.3)": the module a label names


def launching_ops(events: list[dict[str, Any]]) -> dict[Any, str]:
    """External id -> the operator that launched a kernel, then up to CALLERS_SHOWN operators or labelled
    ranges enclosing it on its thread, innermost first ("aten::copy_ < aten::contiguous < sft::swiglu_mlp_bwd").
    A label's module in parentheses is dropped, so one cause over many layers adds up in one entry; the step
    labels enclose everything and are left out."""
    ranges = sorted((e for e in events if e.get("cat") in RANGE_CATEGORIES
                     and not str(e.get("name", "")).startswith((STEP_LABEL, "ProfilerStep"))),
                    key=lambda e: (e.get("pid"), e.get("tid"), e.get("ts", 0.0), -e.get("dur", 0.0)))
    paths: dict[Any, str] = {}
    open_ranges: list[tuple[float, str]] = []  # (end, name) of the ranges enclosing the current one
    thread = None
    for event in ranges:
        start, name = event.get("ts", 0.0), MODULE_SUFFIX.sub("", event["name"])
        if (event.get("pid"), event.get("tid")) != thread:
            open_ranges, thread = [], (event.get("pid"), event.get("tid"))
        while open_ranges and open_ranges[-1][0] <= start:
            open_ranges.pop()
        external = event.get("args", {}).get("External id")
        if event.get("cat") == "cpu_op" and external is not None:
            callers = [caller for _, caller in reversed(open_ranges) if caller != name][:CALLERS_SHOWN]
            paths[external] = " < ".join([name, *callers])
        open_ranges.append((start + event.get("dur", 0.0), name))
    return paths


def kernel_breakdown(events: list[dict[str, Any]]) -> dict[str, Any]:
    """GPU time by kind, and the launching operators (with their callers, `launching_ops`) of memsets and of
    the rest, from a trace's traceEvents. Times in ms; `launched_by` maps kind -> {op path: ms} for memset
    and other."""
    ops_by_id = launching_ops(events)
    by_kind: dict[str, float] = defaultdict(float)
    launched_by: dict[str, dict[str, float]] = {"memset": defaultdict(float), "other": defaultdict(float)}
    for event in events:
        if event.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy"):
            continue
        kind = kernel_kind(event["name"]) if event["cat"] == "kernel" else event["cat"].removeprefix("gpu_")
        ms = float(event.get("dur", 0.0)) / 1e3
        by_kind[kind] += ms
        if kind in launched_by:
            op = ops_by_id.get(event.get("args", {}).get("External id"), event["name"][:60])
            launched_by[kind][op] += ms
    total = sum(by_kind.values())
    return {"total_ms": total, "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "launched_by": {k: dict(sorted(v.items(), key=lambda kv: -kv[1])[:8]) for k, v in launched_by.items()}}


def format_breakdown(breakdown: dict[str, Any]) -> str:
    total = breakdown["total_ms"] or 1.0
    lines = [f"GPU time by kind ({breakdown['total_ms']:.1f} ms of kernels):"]
    lines += [f"  {kind:<22} {ms:9.1f} ms {100 * ms / total:5.1f}%" for kind, ms in breakdown["by_kind"].items()]
    for kind, ops in breakdown["launched_by"].items():
        if ops:
            lines.append(f"  {kind} launched by: " + ", ".join(f"{op} {ms:.1f} ms" for op, ms in ops.items()))
    return "\n".join(lines)


HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")  # the CUDA calls the host made (kernel launches among them)
GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
# Host calls that stall the host: the caching allocator's (cudaFree synchronizes the device; expandable
# segments map and unmap with cuMem*) and the explicit synchronizations.
ALLOCATOR_CALLS = ("cudaMalloc", "cudaFree", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
                   "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree")
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
GAPS_SHOWN = 3  # a step's longest waits of the compute stream, in the log


def step_breakdown(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each profiled step apart (a fast and a slow step side by side): its host wall time, the GPU time of
    the kernels it launched (by kind, and busy = their union: wall - busy is the GPU's idle time), and the
    host's time in allocator and synchronizing calls. A kernel belongs to the step whose range holds its
    launch (matched by the trace's correlation id). Times in ms."""
    ranges = sorted(((e["ts"], e["ts"] + e["dur"], int(e["name"].rsplit(" ", 1)[1])) for e in events
                     if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(STEP_LABEL)))
    rows = [{"step": step, "wall_ms": (end - start) / 1e3, "gpu_ms": defaultdict(float), "intervals": [],
             "allocator_ms": 0.0, "allocator_calls": 0, "sync_ms": 0.0} for start, end, step in ranges]
    launches: dict[Any, int] = {}
    for event in events:
        if event.get("cat") not in HOST_CATEGORIES:
            continue
        index = next((i for i, (start, end, _) in enumerate(ranges) if start <= event["ts"] < end), None)
        if index is None:
            continue
        launches[event.get("args", {}).get("correlation")] = index
        name, ms = event["name"], float(event.get("dur", 0.0)) / 1e3
        if name.startswith(ALLOCATOR_CALLS):
            rows[index]["allocator_ms"] += ms
            rows[index]["allocator_calls"] += 1
        elif name in SYNC_CALLS:
            rows[index]["sync_ms"] += ms
    launches.pop(None, None)
    compute: list[tuple[float, float, str, int]] = []  # (start, end, name, step index) of all but communication
    for event in events:
        index = launches.get(event.get("args", {}).get("correlation"))
        if event.get("cat") in GPU_CATEGORIES and index is not None:
            kind = kernel_kind(event["name"]) if event["cat"] == "kernel" else event["cat"].removeprefix("gpu_")
            end = event["ts"] + float(event.get("dur", 0.0))
            rows[index]["gpu_ms"][kind] += float(event.get("dur", 0.0)) / 1e3
            rows[index]["intervals"].append((event["ts"], end))
            if kind != "communication":
                compute.append((event["ts"], end, event["name"], index))
    for row in rows:
        row["gpu_busy_ms"] = _union_us(row.pop("intervals")) / 1e3
        row["gpu_ms"] = dict(sorted(row["gpu_ms"].items(), key=lambda kv: -kv[1]))
        row["compute_idle_ms"], row["compute_gaps"] = 0.0, []
    _book_compute_gaps(compute, rows)
    return rows


def _book_compute_gaps(compute: list[tuple[float, float, str, int]], rows: list[dict[str, Any]]) -> None:
    """The time no kernel but communication ran, from the profile's first compute kernel on: each gap is the
    step's of the kernel that ends it, so the wait at a step's start (the GPU done, the host still preparing
    the step, e.g. after a host sync) is the step's own. Why: GPU busy counts FSDP's collectives on their own
    streams, which hide a compute stream that waits. Per step: the idle total and its GAPS_SHOWN longest gaps
    (ms, the kernel before, the kernel after)."""
    reach, before = None, ""
    for start, end, name, index in sorted(compute):
        if reach is not None and start > reach:
            gap = (start - reach) / 1e3
            rows[index]["compute_idle_ms"] += gap
            rows[index]["compute_gaps"].append((gap, before, name))
        if reach is None or end > reach:
            reach, before = end, name
    for row in rows:
        row["compute_gaps"] = sorted(row["compute_gaps"], reverse=True)[:GAPS_SHOWN]


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: GPU time with overlapping streams counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def format_steps(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        kinds = ", ".join(f"{kind} {ms:.1f}" for kind, ms in row["gpu_ms"].items()) or "none"
        gaps = "; ".join(f"{ms:.1f} ms after {prev[:50]} before {nxt[:50]}" for ms, prev, nxt in row["compute_gaps"])
        lines.append(f"step {row['step']}: {row['wall_ms']:.1f} ms on the host, GPU busy {row['gpu_busy_ms']:.1f} ms "
                     f"(kernels ms: {kinds}); host in allocator calls {row['allocator_ms']:.1f} ms "
                     f"({row['allocator_calls']} calls), in synchronizing calls {row['sync_ms']:.1f} ms; "
                     f"no compute kernel for {row['compute_idle_ms']:.1f} ms" + (f" (longest: {gaps})" if gaps else ""))
    return "\n".join(lines)


def read_trace(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["traceEvents"]


class StepProfiler:
    """Profiles steps [first, last) on the main process; a no-op when spec is empty."""

    def __init__(self, spec: str, is_main: bool, out_dir: Path):
        first, _, last = spec.partition(":")
        self.first, self.last = (int(first), int(last or int(first) + 1)) if spec and is_main else (-1, -1)
        self.out_dir = out_dir
        self.profiler: Any = None
        self.step_range: Any = None

    def before_step(self, step: int) -> None:
        if step == self.first:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()
        if self.profiler is not None:
            self.step_range = torch.profiler.record_function(f"{STEP_LABEL} {step}")
            self.step_range.__enter__()

    def after_step(self, step: int) -> None:
        if self.step_range is not None:
            self.step_range.__exit__(None, None, None)
            self.step_range = None
        if self.profiler is None or step + 1 < self.last:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.profiler.__exit__(None, None, None)
        table = self.profiler.key_averages().table(sort_by="self_device_time_total" if torch.cuda.is_available()
                                                   else "self_cpu_time_total", row_limit=40, max_name_column_width=70)
        trace = self.out_dir / f"steps-{self.first}-{self.last - 1}.trace.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.profiler.export_chrome_trace(str(trace))
        events = read_trace(trace)
        logger.info("profile of steps %d..%d (trace: %s):\n%s\n%s\n%s", self.first, self.last - 1, trace, table,
                    format_breakdown(kernel_breakdown(events)), format_steps(step_breakdown(events)))
        self.profiler = None
