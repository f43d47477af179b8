"""What a results file's provenance block cannot say itself: a file whose recorded commit is not the code that
ran, or whose tree had uncommitted changes (`dirty`), told here once and shown in BENCHMARKS.md's
`provenance-notes` table (issue #61). The files themselves are never edited (tests/bench/test_results_history.py):
a story about one is added here, in a commit of its own.

tests/bench/test_results_history.py fails when a file of the headline table records `dirty: true` without a note
here, and when a note names no committed file or says nothing about it (under 40 characters).
"""

from __future__ import annotations

import json

from bench.report.table_cells import load_result, markdown_table

_LAGGING_GIT = ("the lent machine's copy of the tree carried a .git whose HEAD lagged the copied files, so write_result "
                "recorded that HEAD and its files as dirty; $BENCH_COMMIT now wins over such a .git")

NOTES: dict[str, str] = {
    "h100/single-2026-11-26/single-llama3.2-1b-ours.json":
        f"records c04fb0d, dirty; BENCHMARKS.md's session prose names 231e87d (25 commits later), the tree that was "
        f"copied: {_LAGGING_GIT}. What ran is 231e87d's tree by the session's account, not provable from the file",
    "h100/single-2026-11-26/single-llama3.2-1b-peer-trl.json":
        "the same call as single-llama3.2-1b-ours.json: c04fb0d recorded, dirty, 231e87d by the session's account",
    "h100/single-2026-11-26/single-llama3.2-1b-peer-trl-compile.json":
        "the same call as single-llama3.2-1b-ours.json: c04fb0d recorded, dirty, 231e87d by the session's account",
    "h200/two-gpu-2026-11-27/multi-2gpu-8b-full-t16k.json":
        f"records ecde883, dirty; the session's other files declare cf32c14 (2 commits later), which BENCHMARKS.md's "
        f"section names: {_LAGGING_GIT}",
    "h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json":
        "its commit field was changed after the bench wrote it and before it was committed (8231943's message says "
        "so): the call's $BENCH_COMMIT was typed as d6d752c5, a typo of d6d752ca, and the full sha of d6d752ca was put "
        "in its place; the only results file known to be edited; kept, not re-measured",
    "h100/parity-2026-11-27a/parity-llama3.2-1b-fp8.json":
        "the same call and the same edit as h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json (d6d752c5 typed, d6d752ca "
        "put in its place before the commit)",
    "h100/parity-2026-11-27a/parity-llama3.2-1b-trl.json":
        "the same call and the same edit as h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json (d6d752c5 typed, d6d752ca "
        "put in its place before the commit)",
    "h100/four-gpu-2026-11-26/lora-bf16-llama70b-4gpu.json":
        f"records 5448956, dirty: {_LAGGING_GIT}. The code that ran was 7eb1507 (BENCHMARKS.md's 4-GPU 2026-11-26 "
        f"section)",
    "h100/four-gpu-2026-11-26/multi-4gpu-8b-full.json":
        f"records 5448956, dirty: {_LAGGING_GIT}. The code that ran was 26d43b0 (BENCHMARKS.md's 4-GPU 2026-11-26 "
        f"section); its 0.86x measured a recompile stall fixed since (our varlen path, no FA4 installed)",
}


def provenance_notes() -> str:
    rows = []
    for name, note in NOTES.items():
        provenance = load_result(name)["provenance"]
        rows.append([f"`{name}`", provenance["commit"][:7], json.dumps(provenance["dirty"]), note])
    return markdown_table(["file (bench/results/…)", "recorded commit", "dirty", "what happened"], rows)


PROVENANCE_TABLES = {"provenance-notes": provenance_notes}
