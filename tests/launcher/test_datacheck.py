"""The login-node data check (contract/datacheck.py): the cached verdict, allowed bad rows in the plan,
and agreement with what the training side skips (one parser for both)."""

from __future__ import annotations

from pathlib import Path

from contract.datacheck import CACHE_MIN_BYTES, cache_file, check_data
from tests.launcher.conftest import REPO, run_cli

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
BAD = '{"conversations": [{"from": "human", "value": "hi"}, {"from": "wizard", "value": "x"}]}'


def _large(path: Path) -> Path:
    """A JSONL file just over the size from which verdicts are cached."""
    lines, size = [], 0
    while size < CACHE_MIN_BYTES:
        line = SAMPLE[len(lines) % len(SAMPLE)]
        lines.append(line)
        size += len(line) + 1
    path.write_text("\n".join(lines) + "\n")
    return path


def test_verdict_is_cached_next_to_the_data_until_the_file_changes(tmp_path: Path) -> None:
    data = _large(tmp_path / "big.jsonl")
    first = check_data(data)
    assert not first.cached and first.bad_rows == 0 and first.format == "sharegpt" and len(first.sha256) == 64
    assert cache_file(data) == tmp_path / ".big.jsonl.sft-check.json" and cache_file(data).is_file()
    again = check_data(data)
    assert again.cached and (again.rows, again.sha256) == (first.rows, first.sha256)
    with data.open("a") as handle:
        handle.write(BAD + "\n")
    changed = check_data(data)
    assert not changed.cached and changed.rows == first.rows + 1 and changed.bad_rows == 1
    assert changed.problems == [f"{data}:{changed.rows}: conversations[1]: unknown role 'wizard' (valid: system, human, gpt, "
                                "function_call, observation)"]
    assert changed.sha256 != first.sha256


def test_small_files_leave_no_cache_behind(tmp_path: Path) -> None:
    data = tmp_path / "small.jsonl"
    data.write_text("\n".join(SAMPLE[:5]) + "\n")
    assert check_data(data).rows == 5 and cache_file(data) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.jsonl"]


def test_allowed_bad_rows_are_counted_in_the_plan(tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(SAMPLE[:6] + [BAD, "{oops"] + SAMPLE[6:20]) + "\n")
    result = run_cli(["--model", "tiny", "--executor", "local", "--data", str(data), "--dry-run",
                      "--set", "data.allow_bad_rows=true", "--output", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("Checked "))
    assert line.startswith("Checked chat.jsonl: 22 rows checked (sharegpt), sha256 ")
    assert f"; 2 bad, skipped (data.allow_bad_rows); first: {data}:7: conversations[1]: unknown role" in line


def test_training_skips_exactly_what_the_check_found(tmp_path: Path) -> None:
    from contract.config import TrainConfig
    from train.dataset.load import build_datasets, load_tokenizer

    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(SAMPLE[:6] + [BAD, "{oops", '["x"]'] + SAMPLE[6:20]) + "\n")
    cfg = TrainConfig()
    cfg.data.path, cfg.data.allow_bad_rows, cfg.run.dir = str(data), True, str(tmp_path / "run")
    stats = build_datasets(cfg, load_tokenizer(cfg)).stats
    check = check_data(data)
    assert (stats["rows"], stats["skipped_bad_rows"]) == (check.rows, check.bad_rows) == (23, 3)
    assert [s.split(": ", 1)[1] for s in stats["skipped_examples"]] == [p.split(": ", 1)[1] for p in check.problems]


def test_parallel_scan_finds_what_the_sequential_one_does(tmp_path: Path, monkeypatch) -> None:
    import contract.datacheck as datacheck

    data = tmp_path / "chat.jsonl"
    lines = [BAD if n in (3, 1500, 2999) else SAMPLE[n % len(SAMPLE)] for n in range(3000)]
    data.write_text("\n".join(lines) + "\n\n{oops")  # a blank line and a last line without newline
    sequential = datacheck._scan(datacheck.LocalData(data), "auto", "text", None)
    monkeypatch.setattr(datacheck, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setattr(datacheck, "CHUNK_BYTES", 64 << 10)  # many chunks
    monkeypatch.setattr(datacheck, "_workers", lambda: 2)
    parallel = datacheck._scan(datacheck.LocalData(data), "auto", "text", None)
    assert parallel == sequential and (parallel.rows, parallel.bad_rows) == (3001, 4)
    assert [p.split(": ")[0] for p in parallel.problems] == [f"{data}:{n}" for n in (4, 1501, 3000, 3002)]
