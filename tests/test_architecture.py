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
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "launcher", "train", "bench")
WHEEL = ("contract", "launcher", "train")  # bench/ is not installed
# package -> top-level names it must never import
FORBIDDEN = {
    "contract": {"launcher", "train", "torch", "bench"},
    "launcher": {"train", "torch", "bench"},
    "train": {"launcher", "bench"},
    "bench": set(),  # drives both sides; nothing imports it but tests
}


# Inside launcher/, train/ (issue #31) and bench/ (issue #51): the modules that sit at a package's top (entry points and what
# every stage shares), and which of the others' areas each area may import; an area is a subpackage
# (launcher.plan) or a top module (launcher.api). An area missing from MAY_IMPORT may import any area:
# launcher's subcommands and train's entry points. Type-only imports count.
TOP_MODULES = {
    "launcher": {"cli", "api", "usage", "runrecord"},
    "train": {"__main__", "main", "evaluate", "export_checkpoint", "chat_cli", "eval_tasks"},
    "bench": set(),  # every module in a folder by what it is; bench/results/ is data, no modules
}
MAY_IMPORT = {
    "launcher": {"launcher.api"},
    "launcher.cli": set(),  # subcommands by name only (importlib), so `--help` stays instant
    "launcher.usage": set(),
    "launcher.runrecord": set(),  # also `python3 -m launcher.runrecord` in every launch.slurm
    "launcher.api": {"launcher.resolve", "launcher.execute", "launcher.ops", "launcher.commands"},  # the plan
    "launcher.plan": set(),
    "launcher.resolve": {"launcher.plan", "launcher.runrecord"},  # run.json's one reader
    "launcher.execute": {"launcher.resolve", "launcher.plan", "launcher.runrecord"},
    "launcher.ops": {"launcher.resolve", "launcher.usage", "launcher.runrecord"},
    "train": set(),
    "train.dataset": set(),
    "train.kernels": set(),
    "train.moe": set(),
    "train.observe": set(),
    "train.engine": {"train.dataset", "train.kernels", "train.moe", "train.observe", "train.persist"},
    "train.persist": set(),
    "bench.common": set(),
    "bench.report": {"bench.common"},
    "bench.peers": {"bench.common", "bench.report"},
    "bench.kernels": {"bench.common", "bench.report"},
    "bench.suites": {"bench.common", "bench.report", "bench.peers"},
    "bench.multi": {"bench.common", "bench.report", "bench.peers", "bench.suites"},  # host.py: how they all start
}
MAX_MODULES = 12  # per folder


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


def _area(module: str) -> str:
    """launcher.plan.planner -> launcher.plan; launcher.api -> launcher.api; contract.x -> contract."""
    parts = module.split(".")
    if parts[0] not in TOP_MODULES or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2])


def _area_graph() -> dict[str, set[str]]:
    areas: dict[str, set[str]] = {}
    for module, targets in _graph(type_only=True).items():
        if module.split(".")[0] in TOP_MODULES:
            found = {_area(t) for t in targets if t.split(".")[0] == module.split(".")[0]}
            areas.setdefault(_area(module), set()).update(found - {_area(module)})
    return areas


def test_subpackages_import_in_the_flow_direction() -> None:
    """e.g. plan never imports resolve or execute; execute never a subcommand; kernels never the loop."""
    bad = [f"{area} imports {target} (may import: {', '.join(sorted(MAY_IMPORT[area])) or 'contract only'})"
           for area, targets in sorted(_area_graph().items()) if area in MAY_IMPORT
           for target in sorted(targets - MAY_IMPORT[area])]
    assert not bad, "imports against the flow between subpackages (tests/test_architecture.py MAY_IMPORT):\n" + \
        "\n".join(bad)
    assert _cycle(_area_graph()) is None


def test_every_module_has_its_place() -> None:
    """A module at launcher/'s or train/'s top must be an entry point or shared (TOP_MODULES); the rest
    live in a subpackage whose direction MAY_IMPORT states."""
    modules = {name: path for name, path in _modules().items()
               if name.split(".")[0] in TOP_MODULES and path.name != "__init__.py"}
    strays = sorted(name for name in modules if name.count(".") == 1
                    and name.split(".")[1] not in TOP_MODULES[name.split(".")[0]])
    assert not strays, f"put these in a subpackage (docs/ARCHITECTURE.md, where to add): {strays}"
    unruled = sorted({_area(name) for name in modules if name.count(".") >= 2} - set(MAY_IMPORT)
                     - {"launcher.commands"})
    assert not unruled, f"a new subpackage: give it its line in MAY_IMPORT: {unruled}"


def test_every_folder_is_small_and_says_what_it_holds() -> None:
    """At most MAX_MODULES modules per folder; each package's docstring: two lines, what lives there
    and what it may import."""
    for package in TOP_MODULES:
        for init in sorted((REPO / package).rglob("__init__.py")):
            folder = init.parent
            count = sum(1 for p in folder.glob("*.py") if p.name != "__init__.py")
            assert count <= MAX_MODULES, f"{folder.relative_to(REPO)}/: {count} modules (> {MAX_MODULES})"
            doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
            assert doc and len(doc.splitlines()) == 2, f"{init.relative_to(REPO)}: a two-line docstring"


def test_the_wheel_lists_every_package() -> None:
    """pyproject.toml names packages one by one (templates/ is installed as launcher.templates)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    on_disk = {_module_name(init) for package in WHEEL for init in (REPO / package).rglob("__init__.py")}
    assert listed - {"launcher.templates"} == on_disk


def test_launcher_and_contract_load_neither_torch_nor_train() -> None:
    names = [name for name in _modules() if name.split(".")[0] in ("contract", "launcher")]
    probe = ("import importlib, json, sys\n"
             f"for name in {names!r}:\n    importlib.import_module(name)\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'train'))))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
