"""Which lm-evaluation-harness tasks an `sft-launch eval` runs: presets, exclusions, the unsafe-code gate.

Decided from lm-eval's own task registry (`TaskManager.task_index`: each task's YAML with its
`dataset_path`, `unsafe_code`), before anything is evaluated:
  - a preset (`leaderboard` = the Open LLM Leaderboard v2 tasks) loses the parts whose data cannot
    be had here: a gated dataset that is not cached and no HF_TOKEN (GPQA), a dataset that is not in
    the HF cache while offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), or a scorer whose Python
    packages are missing; each with its reason, printed and recorded in the results file;
  - tasks that execute model-written code (`unsafe_code: true`) run only with --allow-code-eval.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PRESETS: dict[str, list[str]] = {
    "leaderboard": ["leaderboard_ifeval", "leaderboard_bbh", "leaderboard_gpqa", "leaderboard_math_hard",
                    "leaderboard_musr", "leaderboard_mmlu_pro"],
}
# Datasets behind a click-through licence on the Hub: downloading needs an accepted licence + HF_TOKEN.
GATED_DATASETS = {"Idavidrein/gpqa"}
# Scorers that import packages outside lm-eval's core install (lm-eval's own extras name them).
SCORER_PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "leaderboard_ifeval": ("ifeval", ("langdetect", "immutabledict", "nltk")),
    "leaderboard_math_hard": ("math", ("sympy", "math_verify")),
}
_TRUE = {"1", "true", "yes", "on"}


class TaskSelectionError(ValueError):
    """A usage problem with --tasks (unknown name, unsafe code without the flag): exit 2."""


@dataclass
class Selection:
    tasks: list[str]  # what simple_evaluate gets
    excluded: dict[str, str] = field(default_factory=dict)  # task -> why it was left out of a preset
    unsafe_code: list[str] = field(default_factory=list)  # selected leaf tasks that execute model code


def offline() -> bool:
    return any(os.environ.get(name, "").lower() in _TRUE for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


HUB_PROBE_TIMEOUT_S = 3.0  # one TCP connect; a compute node without network answers in 0 s or not at all


def hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the Hugging Face Hub (HF_ENDPOINT, through HTTPS_PROXY when set) cannot be reached from here
    within `timeout_s`, or None when a TCP connection opens. Without this, an offline compute node
    spends 36-48 s per dataset in huggingface_hub's retries and ends in a long traceback."""
    import socket
    from urllib.parse import urlsplit

    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    target = urlsplit(proxy or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return f"{host}:{port}{' (HTTPS_PROXY)' if proxy else ''}: {err.strerror or err}"
    return None


def default_offline() -> str | None:
    """Unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set, probe the Hub; when it cannot be reached,
    set both (before datasets / huggingface_hub are imported: they read them once) and return why."""
    if offline():
        return None
    reason = hub_unreachable()
    if reason is not None:
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    return reason


def _cache_dirs() -> list[Path]:
    from datasets import config as datasets_config
    from huggingface_hub import constants

    return [Path(constants.HF_HUB_CACHE), Path(datasets_config.HF_DATASETS_CACHE)]


def dataset_cached(dataset_path: str) -> bool:
    """The hub snapshot (datasets--org--name) or the prepared Arrow copy (org___name) is on disk."""
    if Path(dataset_path).exists():
        return True
    hub_name = "datasets--" + dataset_path.replace("/", "--")
    arrow_name = dataset_path.replace("/", "___")
    return any((root / hub_name).is_dir() or (root / arrow_name).is_dir() for root in _cache_dirs())


def leaf_configs(index: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The YAML configs of every task under `name` (a task, a group, or a tag)."""
    entry = index.get(name)
    if entry is None:
        return []
    cfg = entry.cfg or {}
    children = cfg.get("task") if "group" in cfg else None
    if isinstance(children, list):
        found = []
        for child in children:
            found += leaf_configs(index, child) if isinstance(child, str) else [child]
        return found
    if entry.kind.name == "TAG":
        return [e.cfg or {} for e in index.values() if name in e.tags]
    return [cfg]


def unavailable_reason(index: dict[str, Any], name: str) -> str | None:
    """Why the data or scorer of `name` cannot be had here, or None."""
    extra, packages = SCORER_PACKAGES.get(name, ("", ()))
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        return f"scorer needs {', '.join(missing)} (pip install 'lm-eval[{extra}]')"
    for cfg in leaf_configs(index, name):
        path = str(cfg.get("dataset_path") or "")
        if not path or path in ("json", "csv", "parquet", "text") or dataset_cached(path):
            continue
        if path in GATED_DATASETS and not os.environ.get("HF_TOKEN"):
            return f"dataset {path} is gated on the Hugging Face Hub (accept its terms, export HF_TOKEN, then name it)"
        if offline():
            return f"dataset {path} is not in the HF cache and HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set"
    return None


def select(index: dict[str, Any], requested: list[str], allow_code_eval: bool) -> Selection:
    """Expand presets (dropping unavailable parts) and check names and the unsafe-code gate."""
    selection = Selection(tasks=[])
    for name in requested:
        if name in PRESETS:
            for task in PRESETS[name]:
                reason = unavailable_reason(index, task) if task in index else "not in this lm-eval's registry"
                if reason:
                    selection.excluded[task] = reason
                else:
                    selection.tasks.append(task)
            continue
        if name not in index:
            raise TaskSelectionError(f"--tasks: unknown task {name!r} (not in lm-eval's registry or --include-path)")
        if offline() and (reason := unavailable_reason(index, name)):  # one line, not datasets' traceback
            raise TaskSelectionError(f"--tasks: {name}: {reason}")
        selection.tasks.append(name)
    for name in selection.tasks:
        selection.unsafe_code += [str(c.get("task", name)) for c in leaf_configs(index, name) if c.get("unsafe_code")]
    if selection.unsafe_code and not allow_code_eval:
        raise TaskSelectionError(f"--tasks: {', '.join(selection.unsafe_code)} execute(s) model-written code; "
                                 "pass --allow-code-eval to run it (sets HF_ALLOW_CODE_EVAL=1)")
    return selection
