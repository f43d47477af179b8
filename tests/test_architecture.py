"""The one direction of dependency (docs/ARCHITECTURE.md): launcher -> contract <- train.

Read from the source with `ast` (every import, also those inside functions: a late import is still
a dependency), then checked in a fresh interpreter: importing the whole launcher and contract loads
neither torch nor train. `if TYPE_CHECKING:` imports never run: the direction check leaves them out,
the cycle check counts them (a type-only import is still a module that must exist first).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "launcher", "train")
# package -> top-level names it must never import
FORBIDDEN = {
    "contract": {"launcher", "train", "torch"},
    "launcher": {"train", "torch"},
    "train": {"launcher"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "templates":
        parts[0] = "launcher.templates"
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks (annotations only, never imported at run time)."""
    guarded = [node for node in ast.walk(tree) if isinstance(node, ast.If)
               and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")]
    return {id(inner) for node in guarded for stmt in node.body for inner in ast.walk(stmt)}


def _imports(path: Path, modules: dict[str, Path], type_only: bool = False) -> set[str]:
    """Every module `path` imports (submodules resolved where `from pkg import sub` names one);
    `if TYPE_CHECKING:` imports only with `type_only`."""
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if type_only else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in modules else node.module)
    return names


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules, type_only) for name, path in modules.items()}


def test_imports_follow_one_direction() -> None:
    bad = [f"{module} imports {target}"
           for module, targets in _graph().items()
           for target in targets
           if target.split(".")[0] in FORBIDDEN[module.split(".")[0]]]
    assert not bad, "imports against launcher -> contract <- train (no torch in launcher/contract):\n" + "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the project's modules, or None (iterative DFS, colours white/grey/black)."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root] & graph.keys())))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child] & graph.keys()))))
    return None


def test_no_import_cycles_type_only_imports_included() -> None:
    cycle = _cycle(_graph(type_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_find_cycles_late_imports_and_type_only_ones_on_request(tmp_path: Path) -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                      "def f():\n    import train.engine.loop\n")
    assert _imports(source, {}) == {"typing", "train.engine.loop"}
    assert _imports(source, {}, type_only=True) == {"typing", "train.engine.loop", "torch"}


def test_launcher_and_contract_load_neither_torch_nor_train() -> None:
    names = [name for name in _modules() if name.split(".")[0] in ("contract", "launcher")]
    probe = ("import importlib, json, sys\n"
             f"for name in {names!r}:\n    importlib.import_module(name)\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'train'))))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
