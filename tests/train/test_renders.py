"""Every chat row through the model's template before the queue (launcher/resolve/datarules.py, contract/
rendercheck.py): rows a template refuses or trims are refused by location, or skipped and listed under
data.skip_unrenderable, and the training skips exactly those rows (train/dataset/chat.py, same rule)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.launcher.conftest import run_cli
from tests.train.test_chat_templates import family_tokenizers  # noqa: F401  (a fixture)
from tests.train.test_data import make_cfg
from train.dataset.load import build_datasets


def _call(name: str, city: str, number: int) -> dict:
    return {"id": f"call_{number}", "type": "function",
            "function": {"name": name, "arguments": json.dumps({"city": city})}}


PLAIN = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
TEXT_BESIDE_CALL = {"messages": [  # Llama 3.x templates write the call, not the text beside it
    {"role": "user", "content": "Weather in Lima?"},
    {"role": "assistant", "content": "Let me look that up.", "tool_calls": [_call("get_weather", "Lima", 1)]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
    {"role": "assistant", "content": "Sunny, 22 C."}]}
PARALLEL_CALLS = {"messages": [  # Llama 3.x templates raise on two calls at once
    {"role": "user", "content": "Weather in Lima and Quito?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", "Lima", 1), _call("get_weather", "Quito", 2)]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}, {"role": "tool", "tool_call_id": "call_2", "content": "14 C"},
    {"role": "assistant", "content": "Lima 22 C, Quito 14 C."}]}
NOT_ALTERNATING = {"messages": [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Still there?"},
                                {"role": "assistant", "content": "Yes."}]}


def _plan(tmp_path: Path, tokenizer, rows: list[dict], *extra: str):
    data = tmp_path / "calls.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return data, run_cli(["plan", "--executor", "local", "--model", "tiny", "--data", str(data),
                          "--set", f"model.tokenizer={tokenizer.name_or_path}", *extra], tmp_path)


def test_rows_the_template_trims_or_refuses_are_refused_by_row_before_the_queue(tmp_path, family_tokenizers):
    data, result = _plan(tmp_path, family_tokenizers["llama-3.2"], [PLAIN, TEXT_BESIDE_CALL, PARALLEL_CALLS, PLAIN])
    assert result.returncode == 2, result.stdout
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"sft-launch: error: {data}:2: the chat template leaves out messages[1]: assistant text "
                           "'Let me look that up.' (2 of 4 rows of source 'calls' cannot be rendered exactly by ")
    assert line.endswith("or set data.skip_unrenderable = true to skip them, counted in the plan)")


def test_skipped_unrenderable_rows_are_listed_in_the_plan_and_skipped_by_training_alike(tmp_path, family_tokenizers):
    tokenizer = family_tokenizers["llama-3.2"]
    rows = [PLAIN, TEXT_BESIDE_CALL, PARALLEL_CALLS, PLAIN]
    data, result = _plan(tmp_path, tokenizer, rows, "--set", "data.skip_unrenderable=true",
                         "--set", "data.tokens_per_micro_batch=64")  # two small rows left: a micro-batch per rank
    assert result.returncode == 0, result.stderr
    checked = next(line for line in result.stdout.splitlines() if line.startswith("Checked "))
    assert (f"; 2 rows the chat template cannot render exactly, skipped (data.skip_unrenderable): {data}:2: the chat "
            f"template leaves out messages[1]: assistant text 'Let me look that up.'; {data}:3: the chat template "
            "refuses it: This model only supports single tool-calls at once!") in checked
    stats = build_datasets(make_cfg(tmp_path, data, skip_unrenderable=True), tokenizer).stats
    assert (stats["examples"], stats["skipped_mask"]) == (2, 2)
    assert [line.split(": ", 1)[0] for line in stats["skipped_examples"]] == [f"row 1 ({data}:2)", f"row 2 ({data}:3)"]


def test_roles_a_template_requires_to_alternate_are_refused_by_row(tmp_path, family_tokenizers):
    data, result = _plan(tmp_path, family_tokenizers["llama-2"], [PLAIN, NOT_ALTERNATING])
    assert result.returncode == 2
    assert f"error: {data}:2: the chat template refuses it: Conversation roles must alternate" in result.stderr


def test_the_render_pass_over_large_data_is_cached_beside_it(tmp_path):
    from contract.datacheck import CACHE_MIN_BYTES

    sample = (Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
    lines = (sample * (CACHE_MIN_BYTES // sum(len(line) for line in sample) + 1))
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    args = ["plan", "--executor", "local", "--model", "tiny", "--data", "big.jsonl"]
    assert run_cli(args, tmp_path).returncode == 0
    cache = tmp_path / ".big.jsonl.renders.json"
    assert json.loads(cache.read_text())["check"] == {"rows": len(lines), "unrenderable": 0, "problems": []}
    stored = json.loads(cache.read_text())
    stored["check"]["unrenderable"], stored["check"]["problems"] = 1, ["big.jsonl:1: planted"]
    cache.write_text(json.dumps(stored))  # the second plan reads the verdict, not the rows
    again = run_cli(args, tmp_path)
    assert again.returncode == 2 and "big.jsonl:1: planted" in again.stderr
