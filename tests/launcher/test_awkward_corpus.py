"""A corpus of awkward inputs (#60): each trains exactly as declared (the plan's Checked lines count what the
training reads) or is refused in one line before anything is written. In-process `plan` runs (no queue,
nothing written), with the shipped tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import cli
from tests.launcher.conftest import REPO

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
ROWS = [json.loads(line) for line in SAMPLE]


def _jsonl(rows: list, encoding: str = "utf-8", newline: str = "\n") -> bytes:
    return newline.join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows).encode(
        encoding) + newline.encode()


def _parquet(rows: list[dict]) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def _csv(header: str, lines: list[str], bom: bool = False) -> bytes:
    return ("\ufeff" if bom else "").encode() + ("\n".join([header, *lines]) + "\n").encode()


def _msgs(*turns: tuple[str, str], **extra) -> dict:
    return {"messages": [{"role": role, "content": content} for role, content in turns]} | extra


QA = [{"instruction": f"Add {i} and {i}.", "input": "" if i % 2 else f"{i}", "output": str(2 * i)} for i in range(40)]
HELD_OUT = [_msgs(("user", f"Held-out question {i}?"), ("assistant", f"Answer {i}.")) for i in range(5)]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lima"}}}]}
MIX = ('[[data.sources]]\npath = "a.jsonl"\n{a}\n[[data.sources]]\npath = "{b}"\n{rest}\n')

# name -> (files, --data value, extra flags, expected: rows per Checked line, or the refusal's text)
CASES: dict[str, tuple[dict[str, bytes], str, list[str], list[int] | str]] = {
    "jsonl": ({"d.jsonl": _jsonl(SAMPLE[:40])}, "d.jsonl", [], [40]),
    "jsonl-bom": ({"d.jsonl": _jsonl(SAMPLE[:40], "utf-8-sig")}, "d.jsonl", [], [40]),
    "jsonl-crlf": ({"d.jsonl": _jsonl(SAMPLE[:40], newline="\r\n")}, "d.jsonl", [], [40]),
    "jsonl-blank-lines": ({"d.jsonl": _jsonl([*SAMPLE[:20], "", *SAMPLE[20:40], ""])}, "d.jsonl", [], [40]),
    "json-array": ({"d.json": ("[\n" + ",\n".join(SAMPLE[:40]) + "\n]").encode()}, "d.json", [], [40]),
    "json-array-bom": ({"d.json": ("\ufeff[" + ",".join(SAMPLE[:40]) + "]").encode()}, "d.json", [], [40]),
    "jsonl-named-json": ({"d.json": _jsonl(SAMPLE[:40])}, "d.json", [], [40]),
    "json-pretty-array": ({"d.json": json.dumps(ROWS[:40], indent=2).encode()}, "d.json", [], [40]),
    "unicode": ({"d.jsonl": _jsonl([_msgs(("user", f"Grüße {i} 🙂 日本"), ("assistant", "Hallo ✓")) for i in range(40)])},
                "d.jsonl", [], [40]),
    "csv-alpaca": ({"d.csv": _csv("instruction,input,output", [f"Add {i},,{2 * i}" for i in range(40)])},
                   "d.csv", [], [40]),
    "csv-bom": ({"d.csv": _csv("instruction,input,output", [f"Add {i},,{2 * i}" for i in range(40)], True)},
                "d.csv", [], [40]),
    "parquet-messages": ({"d.parquet": _parquet([_msgs(("user", f"Q{i}"), ("assistant", f"A{i}")) for i in range(40)])},
                         "d.parquet", [], [40]),
    "parquet-alpaca": ({"d.parquet": _parquet(QA)}, "d.parquet", [], [40]),
    "alpaca-empty-input": ({"d.jsonl": _jsonl(QA)}, "d.jsonl", [], [40]),
    "prompt-completion": ({"d.jsonl": _jsonl([{"prompt": f"P{i}", "completion": f"C{i}"} for i in range(40)])},
                          "d.jsonl", [], [40]),
    "prompt-completion-lists": ({"d.jsonl": _jsonl([{"prompt": [{"role": "user", "content": f"P{i}"}], "completion": [
        {"role": "assistant", "content": f"C{i}"}]} for i in range(40)])}, "d.jsonl", [], [40]),
    "text": ({"d.jsonl": _jsonl([{"text": f"note {i} " * 30} for i in range(40)])}, "d.jsonl", [], [40]),
    "tokens": ({"d.jsonl": _jsonl([{"input_ids": list(range(1, 60))} for _ in range(40)])}, "d.jsonl", [], [40]),
    "system-turns": ({"d.jsonl": _jsonl([_msgs(("system", "Be brief."), ("user", f"Q{i}"), ("assistant", f"A{i}"))
                                         for i in range(40)])}, "d.jsonl", [], [40]),
    "empty-tool-calls": ({"d.jsonl": _jsonl([{"messages": [{"role": "user", "content": f"Q{i}"}, {
        "role": "assistant", "content": f"A{i}", "tool_calls": []}]} for i in range(40)])}, "d.jsonl", [], [40]),
    "hidden-shards": ({"s/part-0.jsonl": _jsonl(SAMPLE[:20]), "s/part-1.jsonl": _jsonl(SAMPLE[20:40]),
                       "s/.ipynb_checkpoints/part-1-checkpoint.jsonl": _jsonl(SAMPLE[20:40]),
                       "s/.part-2.jsonl": _jsonl(SAMPLE[:5])}, "s", [], [40]),
    "prefixed-splits": ({"c/chats_train.jsonl": _jsonl(SAMPLE[:40]), "c/chats_test.jsonl": _jsonl(SAMPLE[200:205])},
                        "c", [], [40]),
    "synthetic-train": ({"c/train.jsonl": _jsonl(SAMPLE[:20]), "c/train_synthetic.jsonl": _jsonl(SAMPLE[20:40]),
                         "c/test.jsonl": _jsonl(SAMPLE[200:205])}, "c", [], [40]),
    "hub-layout-split-flag": ({"u/train_sft-00000-of-00001.jsonl": _jsonl(SAMPLE[:40]),
                               "u/test_sft-00000-of-00001.jsonl": _jsonl(SAMPLE[200:205])}, "u:split=train_sft", [], [40]),
    "eval-split-beside": ({"c/train.jsonl": _jsonl(SAMPLE[:40]), "c/validation.jsonl": _jsonl(HELD_OUT),
                           "m.toml": b'[[data.sources]]\npath = "c/train.jsonl"\neval_split = "validation"\n'},
                          "m.toml", [], [40, 5]),
    "eval-fraction-duplicates": ({"d.jsonl": _jsonl(SAMPLE[:60] * 2)}, "d.jsonl", ["--set", "data.eval_fraction=0.2"],
                                 [120]),
    "mixture": ({"a.jsonl": _jsonl(SAMPLE[:40]), "b.parquet": _parquet(QA),
                 "m.toml": MIX.format(a="", b="b.parquet", rest="weight = 0.5").encode()}, "m.toml", [], [40, 40]),
    "bad-rows-allowed": ({"d.jsonl": _jsonl([*SAMPLE[:40], "{oops"])}, "d.jsonl", ["--set", "data.allow_bad_rows=true"],
                         [41]),
    # refused, each in one line
    "same-file-twice": ({"a.jsonl": _jsonl(SAMPLE[:40]),
                         "m.toml": MIX.format(a="eval_fraction = 0.2", b="a.jsonl", rest='name = "again"').encode()},
                        "m.toml", [], "eval rows are also training rows"),
    "eval-path-is-training": ({"a.jsonl": _jsonl(SAMPLE[:40]), "b.jsonl": _jsonl(SAMPLE[100:140]),
                               "m.toml": MIX.format(a='eval_path = "b.jsonl"', b="b.jsonl", rest="").encode()},
                              "m.toml", [], "40 of 40 eval rows are also training rows"),
    "wrapped-object": ({"d.json": json.dumps({"version": 1, "data": ROWS[:40]}, indent=1).encode()}, "d.json", [],
                       "whose rows are the list under 'data'"),
    "two-split-words": ({"c/train_test.jsonl": _jsonl(SAMPLE[:40]), "c/test.jsonl": _jsonl(SAMPLE[40:45])}, "c", [],
                        "its name holds two split words (train, test)"),
    "unnamed-beside-named": ({"c/train.jsonl": _jsonl(SAMPLE[:40]), "c/notes.jsonl": _jsonl(SAMPLE[40:45])}, "c", [],
                             "notes.jsonl: its name says no split"),
    "no-such-split": ({"c/train.jsonl": _jsonl(SAMPLE[:40]), "m.toml":
                       b'[[data.sources]]\npath = "c/train.jsonl"\neval_split = "validation"\n'}, "m.toml", [],
                      "no split 'validation'"),
    "eval-split-is-split": ({"c/train.jsonl": _jsonl(SAMPLE[:40]), "m.toml":
                             b'[[data.sources]]\npath = "c/train.jsonl"\neval_split = "train"\n'}, "m.toml", [],
                            "is also the training split"),
    "binary": ({"d.jsonl": b"\x00\x01\x02garbage"}, "d.jsonl", [], "binary data (NUL byte)"),
    "empty": ({"d.jsonl": b""}, "d.jsonl", [], "no rows (empty file)"),
    "all-bad": ({"d.jsonl": _jsonl(["{oops"] * 5)}, "d.jsonl", [], "all rows bad"),
    "a-bad-row": ({"d.jsonl": _jsonl([*SAMPLE[:40], '{"conversations": [{"from": "wizard", "value": "x"}]}'])},
                  "d.jsonl", [], "set data.allow_bad_rows = true to skip them"),
    "tool-without-call": ({"d.jsonl": _jsonl([_msgs(("user", "Q"), ("tool", "42"), ("assistant", "A"))] * 40)},
                          "d.jsonl", [], "a tool turn must follow an assistant turn with tool_calls"),
    "no-assistant": ({"d.jsonl": _jsonl([_msgs(("user", "Q"))] * 40)}, "d.jsonl", [], "all rows bad"),
    "mixed-suffixes": ({"s/a.jsonl": _jsonl(SAMPLE[:20]), "s/b.csv": _csv("text", ["x"])}, "s", [],
                       "a folder of shards holds one kind of file"),
    "csv-extra-values": ({"d.csv": _csv("instruction,input,output", ["Add,,2,extra"] * 40)}, "d.csv", [],
                         "more values in this record"),
    "too-little-data": ({"d.jsonl": _jsonl(SAMPLE[:2])}, "d.jsonl", [], "fewer than one optimizer step needs"),
    "template-drops-tool-calls": ({"d.jsonl": _jsonl([{"messages": [
        {"role": "user", "content": f"Weather {i}?"}, CALL, {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."}]} for i in range(40)])}, "d.jsonl", [],
        "the chat template leaves out messages[1]: tool call 'get_weather'"),
    "unsupported-suffix": ({"s/a.txt": b"hello\n"}, "s", [], "no data files"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_awkward_input_trains_as_declared_or_is_refused_in_one_line(name, tmp_path, monkeypatch, capsys) -> None:
    files, data, extra, expected = CASES[name]
    for relative, content in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes(content)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["plan", "--executor", "local", "--model", "tiny", "--data", data, *extra])
    out, err = capsys.readouterr()
    if isinstance(expected, str):
        errors = [line for line in err.splitlines() if line.startswith("sft-launch: error: ")]
        assert code == 2 and len(errors) == 1 and expected in errors[0], err
    else:
        assert code == 0, err
        checked = [int(line.split(": ", 1)[1].split()[0].replace(",", "")) for line in out.splitlines()
                   if line.startswith("Checked ") and "rows checked" in line]
        assert checked == expected, out
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == sorted(files)
