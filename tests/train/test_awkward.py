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
