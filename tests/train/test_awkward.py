"""Awkward inputs train exactly as declared or are refused in one line (#60): Parquet struct columns read as
the JSON they stand for, a BOM, `tool_calls: []`, a JSON object wrapping the rows, and more."""

from __future__ import annotations

import json
from pathlib import Path

from contract.sources import DataSource
from tests.train.test_chat_templates import family_tokenizers  # noqa: F401  (a fixture)
from tests.train.test_data import make_cfg
from train.dataset.load import build_datasets


def _call(name: str, arguments: dict, number: int) -> dict:
    return {"id": f"call_{number}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool(name: str, properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name}.",
                                             "parameters": {"type": "object", "properties": properties}}}


WEATHER = _tool("get_weather", {"location": {"type": "string"}})
PAY = _tool("pay", {"amount": {"type": "number"}, "to": {"type": "string"}})
TOOL_ROWS = [
    {"messages": [{"role": "user", "content": "Weather in Osaka?"},
                  {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"location": "Osaka"}, 1)]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
                  {"role": "assistant", "content": "18 C in Osaka."}], "tools": [WEATHER]},
    {"messages": [{"role": "user", "content": "Pay Ann 5."},
                  {"role": "assistant", "content": "", "tool_calls": [_call("pay", {"amount": 5, "to": "Ann"}, 1)]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "done"},
                  {"role": "assistant", "content": "Paid."}], "tools": [PAY]},
]


def test_parquet_struct_columns_give_the_tokens_of_the_same_rows_as_jsonl(tmp_path: Path, family_tokenizers) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokenizer = family_tokenizers["qwen2.5"]  # renders tool definitions and calls with their arguments
    rows = TOOL_ROWS * 3
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "calls.parquet")  # arguments, parameters: structs
    assert pa.types.is_list(pq.read_schema(tmp_path / "calls.parquet").field("tools").type)
    ids = {}
    for suffix in ("jsonl", "parquet"):
        cfg = make_cfg(tmp_path / suffix, sources=[DataSource(str(tmp_path / f"calls.{suffix}"), format="messages")])
        ids[suffix] = build_datasets(cfg, tokenizer).train["input_ids"]
    assert ids["parquet"] == ids["jsonl"] and len(ids["jsonl"]) == 6
    assert '"amount": null' not in tokenizer.decode(ids["parquet"][0])


SAMPLE = (Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()


def test_a_utf8_bom_is_not_data_in_jsonl_or_json(tmp_path: Path, tiny_tokenizer) -> None:
    from contract.datacheck import check_data

    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(SAMPLE[:5]) + "\n", encoding="utf-8")
    bom = tmp_path / "bom.jsonl"
    bom.write_text("\n".join(SAMPLE[:5]) + "\n", encoding="utf-8-sig")
    array = tmp_path / "bom.json"
    array.write_text("[\n" + ",\n".join(SAMPLE[:5]) + "\n]\n", encoding="utf-8-sig")
    assert [check_data(p).bad_rows for p in (bom, array)] == [0, 0]
    ids = [build_datasets(make_cfg(tmp_path / p.stem / p.suffix[1:], p), tiny_tokenizer).train["input_ids"]
           for p in (plain, bom, array)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 5


def test_empty_tool_calls_mean_no_call(tmp_path: Path) -> None:
    from contract.formats import parse_row
    from contract.readers import RawRow

    row = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello.", "tool_calls": []}]}
    example = parse_row(RawRow("x:1", row), "messages", "text")
    assert example.messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert not example.has_tool_calls


def test_a_json_object_wrapping_the_rows_is_named_in_one_line(tmp_path: Path) -> None:
    import pytest

    from contract.datacheck import check_data
    from contract.schema import ConfigError

    wrapped = tmp_path / "export.json"
    wrapped.write_text(json.dumps({"version": 2, "data": [json.loads(line) for line in SAMPLE[:3]]}, indent=2))
    with pytest.raises(ConfigError, match=rf"^{wrapped}: one JSON object \(keys data, version\) whose rows are the "
                                          r"list under 'data': save that list as a JSON array or JSONL"):
        check_data(wrapped)
    jsonl_named_json = tmp_path / "rows.json"  # JSONL in a .json file reads on, row by row
    jsonl_named_json.write_text("\n".join(SAMPLE[:3]) + "\n")
    assert check_data(jsonl_named_json).rows == 3


def test_a_files_eval_split_is_named_by_its_own_file(tmp_path: Path, tiny_tokenizer) -> None:
    folder = tmp_path / "chats"
    folder.mkdir()
    (folder / "train.jsonl").write_text("\n".join(SAMPLE[:10]) + "\n")
    (folder / "validation.jsonl").write_text("\n".join(SAMPLE[100:104]) + "\n")
    cfg = make_cfg(tmp_path, sources=[DataSource(str(folder / "train.jsonl"), eval_split="validation")])
    stats = build_datasets(cfg, tiny_tokenizer).stats
    assert stats["path"] == str(folder / "train.jsonl") and stats["eval"]["path"] == str(folder / "validation.jsonl")


def test_data_flag_takes_a_split(tmp_path: Path) -> None:
    from tests.launcher.conftest import rendered_dir, run_cli

    folder = tmp_path / "ultra"
    folder.mkdir()
    (folder / "train_sft-00000-of-00001.jsonl").write_text("\n".join(SAMPLE[:40]) + "\n")
    (folder / "test_sft-00000-of-00001.jsonl").write_text("\n".join(SAMPLE[100:110]) + "\n")
    args = ["--executor", "local", "--model", "tiny", "--dry-run", "--output", str(tmp_path / "run")]
    missing = run_cli([*args, "--data", "ultra"], tmp_path)
    assert missing.returncode == 2
    assert "no split 'train' (has test_sft, train_sft); set the source's split (--data PATH:split=NAME" in missing.stderr
    result = run_cli([*args, "--data", "ultra:split=train_sft"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Checked ultra: 40 rows checked (sharegpt)" in result.stdout
    assert "split = \"train_sft\"" in (rendered_dir(result) / "train.toml").read_text()
