"""The checks bench/suites/gpu_strategies.py makes on a finished run directory: loss, step time and peak
memory from metrics.jsonl, the resumed export against the uninterrupted one (bitwise), the export
loading with from_pretrained, the planner's prediction for the same launch, and the telling line of
a failed run's log."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any


class CaseError(Exception):
    pass


def last_error_line(log: Path) -> str:
    """The most telling line of a failed run's log: the last exception line, else the last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    for line in reversed(lines):
        if any(k in line for k in ("Error", "Exception", "error:", "killed after", "Traceback")):
            return line[:300]
    return lines[-1][:300] if lines else "(empty log)"


def step_stats(records: list[dict[str, Any]]) -> tuple[float | None, float | None, float | None, float | None]:
    """(first loss, last loss, median s/step after the first logged step, peak GiB) from metrics.jsonl."""
    steps = [r for r in records if "loss" in r]
    if not steps:
        return None, None, None, None
    gaps = sorted(b["elapsed_s"] - a["elapsed_s"] for a, b in itertools.pairwise(steps) if b["step"] == a["step"] + 1)
    peaks = [r["peak_mem_gib"] for r in steps if r.get("peak_mem_gib") is not None]
    return (steps[0]["loss"], steps[-1]["loss"], gaps[len(gaps) // 2] if gaps else None,
            max(peaks) if peaks else None)


def export_tensors(export_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in sorted(export_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    if not tensors:
        raise CaseError(f"no *.safetensors in {export_dir}")
    return tensors


def compare_exports(reference: Path, resumed: Path) -> tuple[bool, float]:
    """(bitwise equal, max |difference|) over every exported tensor."""
    a, b = export_tensors(reference), export_tensors(resumed)
    if a.keys() != b.keys():
        raise CaseError(f"exports differ in tensor names: {sorted(a.keys() ^ b.keys())[:4]}")
    bitwise, worst = True, 0.0
    for name, tensor in a.items():
        other = b[name]
        if tensor.shape != other.shape or tensor.dtype != other.dtype:
            raise CaseError(f"{name}: {tensor.shape}/{tensor.dtype} vs {other.shape}/{other.dtype}")
        if not tensor.equal(other):
            bitwise = False
            worst = max(worst, float((tensor.float() - other.float()).abs().max()))
    return bitwise, worst


def export_loads(export_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(export_dir)
    if sum(p.numel() for p in model.parameters()) == 0:
        raise CaseError("exported model has no parameters")


def predicted_peak(launch: Any) -> tuple[float, float, dict[str, Any]]:
    """The planner's allocated / reserved GiB for this launch, and the PlanInput it used."""
    from dataclasses import asdict as as_dict

    from launcher.plan.memory import GIB
    from launcher.commands.plan_cmd import plan_input_from_launch
    from launcher.plan.planner import make_plan

    plan_input = plan_input_from_launch(launch)
    gpu = make_plan(plan_input).gpu
    return gpu.allocated / GIB, gpu.reserved / GIB, as_dict(plan_input)
