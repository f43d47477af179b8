"""Golden files: every template x the example profiles. Regenerate on purpose with
`SFT_UPDATE_GOLDEN=1 python -m pytest tests/launcher -k golden` and review the git diff."""

from __future__ import annotations

import difflib
import os

from tests.launcher.conftest import GOLDEN_DIR, Case, render_case


def test_rendered_files_match_golden(case: Case) -> None:
    rendered = render_case(case)
    golden = GOLDEN_DIR / case.name
    if os.environ.get("SFT_UPDATE_GOLDEN") == "1":
        golden.mkdir(parents=True, exist_ok=True)
        for stale in golden.iterdir():
            stale.unlink()
        for name, text in rendered.items():
            (golden / name).write_text(text, encoding="utf-8")
    expected_names = sorted(p.name for p in golden.iterdir()) if golden.is_dir() else []
    assert sorted(rendered) == expected_names, (
        f"{case.name}: rendered {sorted(rendered)}, golden has {expected_names} "
        "(SFT_UPDATE_GOLDEN=1 regenerates)")
    problems = []
    for name, text in rendered.items():
        expected = (golden / name).read_text(encoding="utf-8")
        if text != expected:
            diff = difflib.unified_diff(expected.splitlines(keepends=True), text.splitlines(keepends=True),
                                        fromfile=f"golden/{case.name}/{name}", tofile=f"rendered/{name}")
            problems.append("".join(diff))
    assert not problems, "rendered files differ from golden (SFT_UPDATE_GOLDEN=1 regenerates):\n" + "\n".join(problems)


def test_deepspeed_json_only_for_zero(case: Case) -> None:
    rendered = render_case(case)
    assert ("deepspeed.json" in rendered) == (case_strategy(case) in ("zero2", "zero3"))


def case_strategy(case: Case) -> str:
    return case.strategy or "fsdp"
