"""RUN/eval/<name>.json, the results files `sft-launch eval` writes (train/evaluate.py), read-only.

Each file holds lm-eval's `results` (per task: "metric,filter" -> value, plus "..._stderr,..."),
`groups`, `versions`, `n-shot`, `configs`, and our `settings` (tasks asked for, tasks a preset left
out and why, limit, few-shot, chat template); with the task `heldout`, also `heldout`: each data
source's eval loss, perplexity, label tokens and examples (`sources`, `all`), and the same losses
under metrics.jsonl's names (`metrics`: eval_loss, eval_loss/<source>). `status` shows the newest
file's held-out table and headline scores, `runs` one short column.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract import protocol

RESULTS_DIR = protocol.EVAL_DIR
PINNED_PREFIX = protocol.EVAL_PINNED_PREFIX  # a checkpoint pinned by `eval --every-checkpoint`


def results_dir(run_dir: Path) -> Path:
    return run_dir / RESULTS_DIR


def checkpoint_export_dir(run_dir: Path, step: int) -> Path:
    """Where `eval --checkpoint STEP` exports that checkpoint (kept and reused by later evals)."""
    return results_dir(run_dir) / f"export-{protocol.checkpoint_name(step)}"


def read_results(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RuntimeError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    return data if isinstance(data, dict) else {}


def latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest readable results file, or None (a file being rewritten is skipped)."""
    paths = sorted(results_dir(run_dir).glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in paths:
        try:
            return read_results(path)
        except (OSError, RuntimeError):
            continue
    return None


def _headline(metrics: dict[str, Any]) -> tuple[str, float] | None:
    """The first metric of a task's results that is a number and not a standard error."""
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and "," in key \
                and "_stderr" not in key:
            return key.split(",")[0] + ("" if key.endswith(",none") else f"[{key.split(',', 1)[1]}]"), float(value)
    return None


def scores(data: dict[str, Any]) -> list[tuple[str, str, float]]:
    """(task or group, metric, value) for what was asked for: results not inside another group."""
    groups = data.get("groups") or {}
    inside = {t for subtasks in (data.get("group_subtasks") or {}).values() for t in subtasks}
    rows = []
    for name, metrics in (data.get("results") or {}).items():
        headline = _headline(groups.get(name) or metrics) if name not in inside else None
        if headline:
            rows.append((name, *headline))
    return rows


def summary(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """What `status` shows of a results file (JSON-ready), or None."""
    if not data:
        return None
    settings = data.get("settings", {})
    return {"name": data.get("name"), "created": data.get("created"),
            "settings": {key: settings.get(key) for key in ("limit", "num_fewshot", "apply_chat_template")},
            "heldout": held_out(data), "scores": [list(row) for row in scores(data)],
            "excluded": settings.get("excluded") or {}}


def held_out(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The `heldout` task's rows: each source's, then "all" when there are several."""
    heldout = data.get(protocol.EVAL_HELDOUT_TASK) or {}
    rows = [row for row in heldout.get("sources") or [] if isinstance(row, dict)]
    if len(rows) > 1 and isinstance(heldout.get("all"), dict):
        rows.append({"name": "all", **heldout["all"]})
    return rows


def _held_out_lines(rows: list[dict[str, Any]]) -> list[str]:
    width = max(len("heldout"), *(len(str(row.get("name"))) for row in rows))
    lines = [f"  {'heldout':<{width}} {'loss':>8} {'perplexity':>11} {'tokens':>11} {'examples':>9}"]
    for row in rows:
        lines.append(f"  {row.get('name')!s:<{width}} {row.get('loss', float('nan')):>8.4f} "
                     f"{row.get('perplexity', float('nan')):>11.3f} {row.get('tokens', 0):>11,} "
                     f"{row.get('examples', 0):>9,}")
    return lines


def format_summary(view: dict[str, Any]) -> str:
    """Lines for `status` and the end of `sft-launch eval --executor local`."""
    settings = view["settings"]
    shots = settings.get("num_fewshot")
    how = [f"limit {settings['limit']:g}" if settings.get("limit") else "",
           f"{shots}-shot" if shots is not None else "",
           "chat template" if settings.get("apply_chat_template") else ""]
    lines = [f"eval         {view['name']} ({view['created']}" + "".join(f", {h}" for h in how if h) + ")"]
    lines += _held_out_lines(view["heldout"]) if view.get("heldout") else []
    lines += [f"  {name:<28} {metric:<16} {value:.4f}" for name, metric, value in view["scores"]]
    lines += [f"  left out {task}: {why}" for task, why in view["excluded"].items()]
    return "\n".join(lines)


def short(view: dict[str, Any] | None) -> str:
    """One cell for `runs`: the held-out loss (of all sources), else the first score; and how many more."""
    if not view:
        return "-"
    heldout = [("heldout", "loss", view["heldout"][-1]["loss"])] if view.get("heldout") else []
    rows = heldout + [tuple(row) for row in view["scores"]]
    if not rows:
        return "-"
    name, metric, value = rows[0]
    return f"{name} {metric} {value:.3f}" + (f" +{len(rows) - 1}" if len(rows) > 1 else "")
