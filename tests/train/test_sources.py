"""Sources as users bring them (contract/sources.py, contract/readers.py, train/dataset/load.py): the same rows
from every kind of file, a shard folder, a saved `datasets` folder and a hub id in a fake HF cache
give the same examples; column and role mappings; tool calls; the mixture's epochs and eval splits."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from contract.config import TrainConfig
from contract.datacheck import LocalData
from contract.schema import ConfigError
from contract.sources import DataSource
from tests.hub_fixture import build_hub_cache
from tests.train.test_chat_templates import family_tokenizers  # noqa: F401  (a fixture)
from tests.train.test_data import BOS, EOT, expected, header, learned_text, make_cfg
from train.dataset.load import build_datasets
from train.engine.loop import Batches
from train.dataset.packing import plan_micro_batches

QA = [{"question": f"What is {i} + {i}?", "answer": f"It is {2 * i}."} for i in range(12)]
QA_SOURCE = {"format": "prompt_completion", "columns": {"prompt": "question", "completion": "answer"},
             "system_prompt": "You add numbers."}


def sources_cfg(tmp_path: Path, *sources: DataSource, **data) -> TrainConfig:
    return make_cfg(tmp_path, sources=list(sources), **data)


def write_every_kind(root: Path, rows: list[dict]) -> dict[str, str]:
    """The same rows as JSONL, a JSON array, Parquet, CSV, a folder of JSONL shards and a saved dataset."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    (root / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "qa.json").write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    pq.write_table(pa.Table.from_pylist(rows), root / "qa.parquet")
    with (root / "qa.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (root / "shards").mkdir()
    for number, part in enumerate((rows[:5], rows[5:])):
        (root / "shards" / f"part-{number:05d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "saved"))
    return {kind: str(root / name) for kind, name in (("jsonl", "qa.jsonl"), ("json", "qa.json"),
            ("parquet", "qa.parquet"), ("csv", "qa.csv"), ("shards", "shards"), ("saved", "saved"))}


def test_every_kind_of_source_gives_the_same_examples(tmp_path, tiny_tokenizer, monkeypatch):
    paths = write_every_kind(tmp_path / "data", QA)
    monkeypatch.setenv("HF_HOME", str(build_hub_cache(tmp_path / "hf", "sft-test/tiny_qa", {"train": QA})))
    paths["hub"] = "sft-test/tiny_qa"
    results = {}
    for kind, path in paths.items():
        cfg = sources_cfg(tmp_path / kind, DataSource(path, name=kind, **QA_SOURCE))
        bundle = build_datasets(cfg, tiny_tokenizer)
        results[kind] = (bundle.train["input_ids"], bundle.train["labels"])
        assert bundle.stats["rows"] == len(QA) and bundle.stats["skipped"] == 0, kind
    assert all(result == results["jsonl"] for result in results.values())
    ids, labels = results["jsonl"][0][3], results["jsonl"][1][3]
    assert (ids, labels) == expected(tiny_tokenizer, [
        (BOS + header("system") + "You add numbers." + EOT + header("user") + "What is 3 + 3?" + EOT
         + header("assistant"), False),
        ("It is 6." + EOT, True),
    ])


def test_hub_split_and_config_are_read_from_the_cache_only(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(build_hub_cache(tmp_path / "hf", "sft-test/tiny_qa",
                                                      {"train": QA[:8], "test": QA[8:]})))
    cfg = sources_cfg(tmp_path, DataSource("sft-test/tiny_qa", eval_split="test", **QA_SOURCE))
    bundle = build_datasets(cfg, tiny_tokenizer)
    assert (len(bundle.train), len(bundle.eval)) == (8, 4)
    for source, message in ((DataSource("sft-test/tiny_qa", split="dev", **QA_SOURCE), 'Unknown split "dev"'),
                            (DataSource("sft-test/other", **QA_SOURCE), "not in the HF datasets cache"),
                            (DataSource("sft-test/tiny_qa", config="v2", **QA_SOURCE), "config 'v2' not in the cache")):
        with pytest.raises(ConfigError, match=message):
            build_datasets(sources_cfg(tmp_path / source.split / source.config, source), tiny_tokenizer)


def test_sharegpt_columns_and_role_names_are_mapped(tmp_path, tiny_tokenizer):
    standard = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
    custom = {"dialog": [{"speaker": "asker", "text": "Hi"}, {"speaker": "bot", "text": "Hello."}]}
    (tmp_path / "standard.jsonl").write_text(json.dumps(standard) + "\n")
    (tmp_path / "custom.jsonl").write_text(json.dumps(custom) + "\n")
    mapped = DataSource(str(tmp_path / "custom.jsonl"), format="sharegpt", roles={"asker": "user", "bot": "assistant"},
                        columns={"conversations": "dialog", "from": "speaker", "value": "text"})
    got = build_datasets(sources_cfg(tmp_path / "a", mapped), tiny_tokenizer).train
    standard_source = DataSource(str(tmp_path / "standard.jsonl"))
    want = build_datasets(sources_cfg(tmp_path / "b", standard_source), tiny_tokenizer).train
    assert got["input_ids"] == want["input_ids"] and got["labels"] == want["labels"]


TOOL_ROW = {"messages": [
    {"role": "user", "content": "Weather in Lima?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
    {"role": "assistant", "content": "Sunny, 22 C."},
]}


def test_tool_calls_are_rendered_by_the_template_and_only_assistant_turns_learned(tmp_path, family_tokenizers):
    tokenizer = family_tokenizers["qwen2.5"]  # Qwen's template renders tool calls and tool results
    (tmp_path / "tools.jsonl").write_text(json.dumps(TOOL_ROW) + "\n")
    bundle = build_datasets(sources_cfg(tmp_path, DataSource(str(tmp_path / "tools.jsonl"))), tokenizer)
    ids, labels = bundle.train[0]["input_ids"], bundle.train[0]["labels"]
    whole, learned = tokenizer.decode(ids), learned_text(tokenizer, labels)
    assert "22 C, sunny" in whole and '"city": "Lima"' in whole
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>' in learned
    assert "Sunny, 22 C." in learned and "22 C, sunny" not in learned and "Weather in Lima?" not in learned


def test_a_template_that_drops_tool_calls_is_refused_before_training(tmp_path, tiny_tokenizer):
    from train.dataset.maskcheck import check

    (tmp_path / "tools.jsonl").write_text(json.dumps(TOOL_ROW) + "\n")
    sample = {"path": str(tmp_path / "tools.jsonl"), "format": "messages", "tool_row": f"{tmp_path}/tools.jsonl:1"}
    reason = check(str(Path(tiny_tokenizer.name_or_path)), [sample])
    assert reason.endswith(f"{tmp_path}/tools.jsonl: the chat template leaves out messages[1]: tool call "
                           "'get_weather' (call 1 of that name)")


def test_mixture_epochs_pack_across_sources(tmp_path, tiny_tokenizer):
    paths = write_every_kind(tmp_path / "data", QA)
    chat = DataSource(str(Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl"),
                      eval_fraction=0.1)
    held = write_every_kind(tmp_path / "held", [{"question": f"What is {i} - 1?", "answer": str(i - 1)}
                                                for i in range(12)])  # eval rows no source trains on
    qa = DataSource(paths["parquet"], name="qa", weight=0.5, eval_path=held["csv"], **QA_SOURCE)
    bundle = build_datasets(sources_cfg(tmp_path, chat, qa), tiny_tokenizer)
    # 30 of the sample held out, 10 of which duplicate kept rows: trained (contract/overlap.py's eval_indices)
    assert bundle.mixture.sizes == (280, 12) and bundle.mixture.takes == (280, 6)
    assert sorted(bundle.eval_parts) == ["qa", "sample_chat"] and len(bundle.eval_parts["qa"]) == 12
    assert [s["name"] for s in bundle.stats["sources"]] == ["sample_chat", "qa"]
    batches = Batches(bundle.train, list(bundle.train["length"]), 512, 7, True, 0, bundle.mixture)
    epochs = [[i for micro_batch in batches.plan(epoch) for i in micro_batch] for epoch in (0, 1)]
    for chosen in epochs:
        assert len(chosen) == 286 and sum(i >= 280 for i in chosen) == 6
    assert {i for i in epochs[0] if i >= 280} != {i for i in epochs[1] if i >= 280}  # another half each epoch
    assert any(min(mb) < 280 <= max(mb) for mb in batches.plan(0))  # documents of both in one micro-batch


def test_one_source_plans_exactly_as_before(tmp_path, tiny_tokenizer):
    cfg = TrainConfig()
    cfg.run.dir = str(tmp_path / "run")
    bundle = build_datasets(cfg, tiny_tokenizer)
    lengths = list(bundle.train["length"])
    batches = Batches(bundle.train, lengths, 256, 7, True, 0, bundle.mixture)
    assert bundle.mixture.is_plain and not bundle.eval_parts and "sources" not in bundle.stats
    assert batches.plan(3) == plan_micro_batches(lengths, 256, 7, 3)


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_splits_named_by_files_are_honoured_and_never_overlap(tmp_path, tiny_tokenizer):
    """The layouts of public sets: ultrachat's `train_sft-*.parquet` beside `test_sft-*`, the hub's
    `data/train-*.parquet`, a folder per split, and a file whose eval split lies beside it."""
    train, test = QA[:8], QA[8:]
    _parquet(tmp_path / "ultra" / "data" / "train_sft-00000-of-00001.parquet", train)
    _parquet(tmp_path / "ultra" / "data" / "test_sft-00000-of-00001.parquet", test)
    _parquet(tmp_path / "hub" / "data" / "train-00000-of-00002.parquet", train[:4])
    _parquet(tmp_path / "hub" / "data" / "train-00001-of-00002.parquet", train[4:])
    _parquet(tmp_path / "hub" / "data" / "test-00000-of-00001.parquet", test)
    for split, rows in (("train", train), ("validation", test)):
        (tmp_path / "per_split" / split).mkdir(parents=True)
        (tmp_path / "per_split" / split / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _parquet(tmp_path / "beside" / "train-00000-of-00001.parquet", train)
    _parquet(tmp_path / "beside" / "test-00000-of-00001.parquet", test)
    cases = {"ultra": DataSource(str(tmp_path / "ultra"), split="train_sft", eval_split="test_sft", **QA_SOURCE),
             "hub": DataSource(str(tmp_path / "hub"), eval_split="test", **QA_SOURCE),
             "per_split": DataSource(str(tmp_path / "per_split"), eval_split="validation", **QA_SOURCE),
             "beside": DataSource(str(tmp_path / "beside" / "train-00000-of-00001.parquet"), eval_split="test",
                                  **QA_SOURCE)}
    for name, source in cases.items():
        bundle = build_datasets(sources_cfg(tmp_path / f"run-{name}", source), tiny_tokenizer)
        trained, evaluated = set(map(tuple, bundle.train["input_ids"])), set(map(tuple, bundle.eval["input_ids"]))
        assert (len(trained), len(evaluated), len(trained & evaluated)) == (8, 4, 0), name
    with pytest.raises(ConfigError, match=r"ultra: no split 'train' \(has test_sft, train_sft\); set the source's split \(--data PATH:split="):
        build_datasets(sources_cfg(tmp_path / "run-default", DataSource(str(tmp_path / "ultra"), **QA_SOURCE)),
                       tiny_tokenizer)
    plain = tmp_path / "plain" / "qa.parquet"
    _parquet(plain, QA)
    for source, message in ((DataSource(str(plain), eval_split="validation", **QA_SOURCE), "no split 'validation'"),
                            (DataSource(str(plain), split="train_sft", **QA_SOURCE), "no split 'train_sft'")):
        with pytest.raises(ConfigError, match=message):
            build_datasets(sources_cfg(tmp_path / "run-plain", source), tiny_tokenizer)


WEATHER_TOOL = {"name": "get_weather", "description": "Current weather of a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def function_calling_rows() -> list[dict]:
    """ShareGPT's function-calling layout (glaive / xLAM / LLaMA-Factory): function_call and observation
    turns, the tool definitions as a JSON string column."""
    call = json.dumps({"name": "get_weather", "arguments": {"city": "Lima"}})
    return [{"conversations": [{"from": "human", "value": f"Weather in Lima, take {i}?"},
                               {"from": "function_call", "value": call},
                               {"from": "observation", "value": '{"temp_c": 22, "sky": "sunny"}'},
                               {"from": "gpt", "value": f"Sunny, 22 C ({i})."}],
             "tools": json.dumps([WEATHER_TOOL])} for i in range(3)]


def test_function_calling_sharegpt_trains_real_tool_calls_with_the_tools_in_the_prompt(tmp_path, family_tokenizers):
    """Llama 3.2's template: the call is learned as the template writes it, the tools' schema and the tool
    result are in the prompt, not learned; the launcher's render check accepts the `tojson`-rendered result."""
    from train.dataset.maskcheck import check

    tokenizer = family_tokenizers["llama-3.2"]
    _parquet(tmp_path / "fc.parquet", function_calling_rows())
    bundle = build_datasets(sources_cfg(tmp_path / "run", DataSource(str(tmp_path / "fc.parquet"))), tokenizer)
    ids, labels = bundle.train[0]["input_ids"], bundle.train[0]["labels"]
    whole, learned = tokenizer.decode(ids), learned_text(tokenizer, labels)
    assert '"description": "Current weather of a city."' in whole and "Current weather" not in learned
    assert '{"name": "get_weather", "parameters": {"city": "Lima"}}' in learned
    assert '"{\\"temp_c\\": 22, \\"sky\\": \\"sunny\\"}"' in whole and "temp_c" not in learned
    assert "Sunny, 22 C (0)." in learned
    sample = {"path": str(tmp_path / "fc.parquet"), "format": "sharegpt", "tool_row": f"{tmp_path}/fc.parquet[row 1]"}
    assert check(str(Path(tokenizer.name_or_path)), [sample]) is None
    openai = {"path": str(tmp_path / "tools.jsonl"), "format": "messages", "tool_row": "tools.jsonl:1"}
    (tmp_path / "tools.jsonl").write_text(json.dumps(TOOL_ROW) + "\n")
    assert check(str(Path(tokenizer.name_or_path)), [openai]) is None  # refused before: "22 C, sunny" via tojson


def test_a_bad_tool_call_is_named_by_row_and_a_tools_file_reaches_the_template(tmp_path, family_tokenizers):
    tokenizer = family_tokenizers["qwen2.5"]
    rows = function_calling_rows()
    rows[1]["conversations"][1]["value"] = '{"name": "get_weather", "arguments": '
    _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ConfigError, match=r"bad.parquet\[row 2\]: conversations\[1\]: the tool call is not JSON"):
        build_datasets(sources_cfg(tmp_path / "bad", DataSource(str(tmp_path / "bad.parquet"))), tokenizer)
    (tmp_path / "tools.json").write_text(json.dumps([WEATHER_TOOL]))
    (tmp_path / "calls.jsonl").write_text(json.dumps(TOOL_ROW) + "\n")
    source = DataSource(str(tmp_path / "calls.jsonl"), tools=str(tmp_path / "tools.json"))
    whole = tokenizer.decode(build_datasets(sources_cfg(tmp_path / "file", source), tokenizer).train[0]["input_ids"])
    assert '"description": "Current weather of a city."' in whole  # Qwen writes the tools into its system turn


def test_the_plans_token_count_is_the_trainings_in_every_layout(tmp_path, tiny_tokenizer, family_tokenizers,
                                                                 monkeypatch):
    """launcher/plan/tokencount.py (tokenizers + Jinja, no torch) counts what train/dataset/load.py tokenizes:
    Q&A rows in every kind of file, a folder, a saved dataset and a hub id; ShareGPT chats; function
    calling with its tools in Llama 3.2's prompt. (characters / 3.5 was off by up to 2.6x.)"""
    from types import SimpleNamespace

    from launcher.resolve.plan_sources import estimate_source
    from launcher.resolve.profile import ClusterProfile

    hf_home = build_hub_cache(tmp_path / "hf", "sft-test/tiny_qa", {"train": QA})
    monkeypatch.setenv("HF_HOME", str(hf_home))
    cases = {kind: (DataSource(path, **QA_SOURCE), tiny_tokenizer)
             for kind, path in write_every_kind(tmp_path / "data", QA).items()}
    cases["hub"] = (DataSource("sft-test/tiny_qa", **QA_SOURCE), tiny_tokenizer)
    chat = Path(__file__).resolve().parents[2] / "train" / "assets" / "sample_chat.jsonl"
    cases["sharegpt"] = (DataSource(str(chat)), tiny_tokenizer)
    _parquet(tmp_path / "fc.parquet", function_calling_rows())
    cases["function_calling"] = (DataSource(str(tmp_path / "fc.parquet")), family_tokenizers["llama-3.2"])
    for kind, (source, tokenizer) in cases.items():
        cfg = sources_cfg(tmp_path / f"run-{kind}", source)
        cfg.model.tokenizer = str(Path(tokenizer.name_or_path))
        trained = build_datasets(cfg, tokenizer).stats["tokens"]
        launch = SimpleNamespace(profile=ClusterProfile(hf_home=str(hf_home)), train=cfg, data_checks=[])
        planned = estimate_source(launch, source)
        assert planned.tokens == trained and "rows counted with" in planned.method, (kind, planned, trained)


def test_tokenizing_on_several_cores_gives_what_one_process_gives(tmp_path, tiny_tokenizer):
    """train/dataset/tokenize.py: blocks handed to 2 spawned workers come back in order: the same
    columns, the same stats, the same skipped rows named, as tokenizing in this process."""
    from train.dataset.tokenize import tokenize_input

    rows = [json.loads(line) for line in (Path(__file__).resolve().parents[2] / "train" / "assets"
                                          / "sample_chat.jsonl").read_text().splitlines()[:40]]
    rows[5] = {"conversations": [{"from": "human", "value": "no reply"}]}  # skipped (allow_bad_rows)
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = make_cfg(tmp_path, allow_bad_rows=True)
    source = DataSource(str(tmp_path / "chats.jsonl"))
    results = [tokenize_input(LocalData(Path(source.path)).rows(), source, source.path, "data.path", tiny_tokenizer,
                              cfg, workers=workers, block_rows=7) for workers in (1, 2)]
    (one, one_stats), (two, two_stats) = results
    assert one.to_dict() == two.to_dict() and one_stats == two_stats
    assert (two_stats.rows, two_stats.skipped_bad_rows, len(two)) == (40, 1, 39)
