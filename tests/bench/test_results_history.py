"""Results files are append-only (issue #61), read from the git history: a committed file under bench/results is never
changed by a later commit (a rename without changes is allowed); every file's provenance commit is in the history
before the commit that added it; no file or run is a copy of another; a file of the headline table that records
uncommitted changes (`dirty`) has its story in bench/report/provenance_notes.py.

So each tampering of issue #61's audit done in a later commit fails here: seconds, windows or a peer run edited, a
GPU renamed, a provenance commit replaced, `dirty` flipped, a `difference_reason` typed in (all: a committed file
changed), and a call copied into a new dated folder (a copy). CI runs on a full clone; a shallow clone fails with
how to deepen it, a tree without .git (a copy, an sdist) skips.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from bench.report.provenance_notes import NOTES
from bench.report.results_io import RESULTS, ROOT
from bench.report.tables_headline import JOBS, copied_baseline, rows_of
from tests.bench.results_checks import FILES, load, result_id

UNDER = str(RESULTS.relative_to(ROOT))  # bench/results
# Committed results files changed after the commit that added them, and why: (path under bench/results, commit's
# short sha) -> reason. None today (item 3's edited file was edited before its first commit: provenance_notes.py).
ALLOWED_CHANGES: dict[tuple[str, str], str] = {}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module", autouse=True)
def full_history():
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout (a copy of the tree or an sdist): the results' history cannot be read")
    if _git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.fail("a shallow clone: the results' history is cut off (git fetch --unshallow)")


@cache
def _changes() -> list[tuple[str, str, str]]:
    """(commit, status, path under bench/results) of every commit that changed, renamed or copied a results file;
    renames and copies with their similarity (R100: unchanged); and the uncommitted changes as commit "worktree"."""
    log = _git("log", "-M", "--format=@%h", "--name-status", "--diff-filter=MTRC", "--", UNDER)
    worktree = _git("diff", "-M", "--name-status", "--diff-filter=MTRC", "HEAD", "--", UNDER)
    return name_status(log) + name_status("@worktree\n" + worktree)


def name_status(log: str) -> list[tuple[str, str, str]]:
    """`git log --format=@%h --name-status` as (commit, status, path under bench/results: the new path of a
    rename)."""
    found = []
    for block in log.split("@")[1:]:
        commit, _, text = block.partition("\n")
        for line in filter(None, text.splitlines()):
            status, *paths = line.split("\t")
            found.append((commit, status, paths[-1].removeprefix(UNDER + "/")))
    return found


@cache
def _added() -> dict[str, str]:
    """Each results file's adding commit (full sha; the newest rename's for a renamed file), HEAD for one not yet
    committed."""
    log = _git("log", "-M", "--format=@%H", "--name-status", "--diff-filter=AR", "--", UNDER)
    added = {path: commit for commit, _, path in reversed(name_status(log))}  # oldest first: a later rename wins
    head = _git("rev-parse", "HEAD").strip()
    return {result_id(path): added.get(result_id(path), head) for path in FILES}


def modifications(changes: list[tuple[str, str, str]]) -> list[str]:
    """The changes that edit a results file: a modification, or a rename or copy that is not 100% similar."""
    return [f"{path}: changed by {commit} ({status})" for commit, status, path in changes
            if status[0] in "MT" or (status[0] in "RC" and status[1:] != "100")
            if (path, commit) not in ALLOWED_CHANGES]


def _after_adding(commit: str, path: str) -> bool:
    """Whether `commit` changed the file now at `path` (not a removed file of the same name before it was added)."""
    if not (RESULTS / path).exists():
        return False
    added = _added().get(path) or _git("log", "-M", "--format=%H", "--diff-filter=AR", "-1", "--", f"{UNDER}/{path}").strip()
    return commit == "worktree" or subprocess.run(["git", "merge-base", "--is-ancestor", commit, added], cwd=ROOT,
                                                  capture_output=True).returncode != 0


def test_no_committed_results_file_is_changed_after_the_commit_that_added_it():
    edited = modifications([change for change in _changes() if _after_adding(change[0], change[2])])
    assert not edited, "results files are append-only (write a new file through results_io):\n" + "\n".join(edited)


def test_the_allowed_changes_still_apply():
    for (path, commit), reason in ALLOWED_CHANGES.items():
        assert (RESULTS / path).is_file() and len(reason) > 40, path
        assert any((c, p) == (commit, path) for c, _, p in _changes()), f"{path}: {commit} does not change it"


def test_an_edit_in_a_later_commit_is_caught():
    """The parse on a history with one edit and one pure rename (what `git log --name-status` prints)."""
    log = (f"@abc1234\n\nM\t{UNDER}/h100/x/multi-4gpu-8b-full.json\n@def5678\n\nR100\t{UNDER}/a.json\t"
           f"{UNDER}/h100/y/a.json\nR097\t{UNDER}/b.json\t{UNDER}/c.json\n")
    assert modifications(name_status(log)) == ["h100/x/multi-4gpu-8b-full.json: changed by abc1234 (M)",
                                      "c.json: changed by def5678 (R097)"]


def _commits(data: dict) -> list[str]:
    commits = [data["provenance"]["commit"]]
    return commits + [source["provenance"]["commit"] for source in data.get("merged_from", [])]


@pytest.mark.parametrize("path", FILES, ids=result_id)
def test_the_provenance_commit_is_in_the_history_before_the_file(path):
    name, added = result_id(path), _added()[result_id(path)]
    for commit in _commits(load(path)):
        known = subprocess.run(["git", "merge-base", "--is-ancestor", commit, added], cwd=ROOT, capture_output=True)
        assert known.returncode == 0, f"{name}: provenance commit {commit} is not in the history before {added[:7]}"


def test_no_results_file_or_run_is_a_copy_of_another():
    """A call copied into a new folder (the same bytes), or a run copied into another place (the same real tokens and
    seconds), other than the bf16 side multi_fp8.py --fp8-baseline takes from another file by design."""
    by_bytes, by_run = defaultdict(list), defaultdict(list)
    for path in FILES:
        data, name = load(path), result_id(path)
        by_bytes[hashlib.sha256(path.read_bytes()).hexdigest()].append(name)
        for where, block in _runs(data):
            if not (where == "fp8_8b.bf16" and copied_baseline(data)):
                by_run[(block["real_tokens"], block["seconds"])].append(f"{name}: {where}")
    copies = [names for names in [*by_bytes.values(), *by_run.values()] if len(names) > 1]
    assert not copies, f"copies: {copies}"


def _runs(node: object, where: str = "") -> list[tuple[str, dict]]:
    """Every block with raw real tokens and seconds in a results file, with its key path."""
    found = []
    if isinstance(node, dict):
        if "real_tokens" in node and "seconds" in node:
            found.append((where, node))
        for key, value in node.items():
            found += _runs(value, f"{where}.{key}".lstrip("."))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _runs(value, f"{where}[{index}]")
    return found


def test_a_dirty_headline_file_has_its_story_told():
    shown = {row.file for job in JOBS for row in rows_of(job) if row.file}
    untold = [name for name in sorted(shown) if load(RESULTS / name)["provenance"]["dirty"] and name not in NOTES]
    assert not untold, f"headline files with uncommitted changes and no note in provenance_notes.py: {untold}"


def test_every_provenance_note_is_about_a_committed_file():
    for name, note in NOTES.items():
        assert (RESULTS / name).is_file() and len(note) >= 40, name
        assert Path(name).suffix == ".json", name
