"""Long documents before the queue (#54): the plan finds the rows longer than model_max_length in every
format it reads (JSONL, Parquet, a saved `datasets` folder, a hub dataset in the HF cache), from the
tokenizer's count where it ran, and `--model_max_length auto` follows the longest document
(launcher/plan/datasize.py, launcher/resolve/plan_sources.py, launcher/resolve/max_length.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from contract.config import TrainConfig, load_train_config
from contract.schema import ConfigError
from contract.sources import DataSource
from launcher.commands.plan_cmd import plan_launch
from launcher.execute.render import record_fields, render_files
from launcher.plan import datasize
from launcher.resolve import max_length, plan_sources
from launcher.resolve.options import LaunchRequest, resolve
from launcher.resolve.profile import ClusterProfile
from tests.hub_fixture import build_hub_cache

QA_SOURCE = {"format": "prompt_completion", "columns": {"prompt": "question", "completion": "answer"}}
LONG = [{"question": "Recite it all.", "answer": "lorem ipsum dolor " * n} for n in (600, 300, 150)]
ROWS = LONG + [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
MAX_LENGTH = 512


def _write_every_format(root: Path, rows: list[dict]) -> dict[str, str]:
    """The rows as JSONL, Parquet, a saved `datasets` folder and a hub dataset in root/hf's cache."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    (root / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(pa.Table.from_pylist(rows), root / "qa.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "saved"))
    build_hub_cache(root / "hf", "sft-test/long_qa", {"train": rows})
    return {"jsonl": str(root / "qa.jsonl"), "parquet": str(root / "qa.parquet"), "saved": str(root / "saved"),
            "hub": "sft-test/long_qa"}


def _estimates(paths: dict[str, str], hf_home: Path, tokenizer: str = "") -> dict[str, datasize.DataEstimate]:
    cfg = TrainConfig()
    cfg.train.model_max_length, cfg.model.tokenizer = MAX_LENGTH, tokenizer
    launch = SimpleNamespace(profile=ClusterProfile(hf_home=str(hf_home)), train=cfg, data_checks=[])
    return {kind: plan_sources.estimate_source(launch, DataSource(path, **QA_SOURCE)) for kind, path in paths.items()}


def test_every_format_names_its_long_documents_estimated_or_counted(tmp_path: Path) -> None:
    """Characters / 3.5 without a tokenizer.json, the tokenizer's exact lengths with one: the same three long
    rows and the same longest in every format, and the line says what it read."""
    paths = _write_every_format(tmp_path, ROWS)
    estimated = _estimates(paths, tmp_path / "hf", tokenizer="no-such/tokenizer")
    assert {(e.rows, e.longer, e.longest) for e in estimated.values()} == {(43, 3, 3092)}, estimated
    assert {e.lengths for e in estimated.values()} == {"chars/3.5 of all 43 rows"}
    counted = _estimates(paths, tmp_path / "hf")
    assert len({(e.rows, e.longer, e.longest) for e in counted.values()}) == 1, counted
    assert counted["jsonl"].longer == 3 and counted["jsonl"].longest > MAX_LENGTH
    assert {e.lengths for e in counted.values()} == {"counted with tiny-tokenizer's tokenizer on all 43 rows"}


def test_a_large_parquet_file_is_sampled_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first batches only (SAMPLE_BYTES), the rows from the metadata, the long rows scaled to them."""
    monkeypatch.setattr(datasize, "SAMPLE_BYTES", 1)  # the first batch of SAMPLE_BATCH_ROWS rows
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, sample = ROWS * 20, datasize.SAMPLE_BATCH_ROWS  # 860 rows, 60 long
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "qa.parquet")
    estimate = datasize.estimate_tokens(tmp_path / "qa.parquet", MAX_LENGTH)
    assert estimate is not None and estimate.rows == 860 and estimate.exact_rows
    assert estimate.lengths == f"chars/3.5 of a sample: the first {sample} of 860 rows"
    assert estimate.longer == round(sum(1 for row in rows[:sample] if len(row["answer"]) > 1000) * 860 / sample)


def _jsonl(root: Path, rows: list[dict]) -> str:
    """The rows as prompt/completion JSONL (the format auto-detected)."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "qa.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["question"], "completion": r["answer"]}) + "\n" for r in rows))
    return str(data)


def _local(tmp_path: Path, rows: list[dict], *flags: str) -> SimpleNamespace:
    launch = resolve(LaunchRequest(model="tiny", executor="local", data=_jsonl(tmp_path, rows),
                                   output=str(tmp_path / "run"), train_flags={"model_max_length": "auto"}, sets=list(flags)))
    return SimpleNamespace(launch=launch, text=plan_launch(launch).text, files=render_files(launch))


def test_auto_follows_the_longest_document_into_the_plan_train_toml_and_run_json(tmp_path: Path) -> None:
    """The longest document counted with the tokenizer, rounded up to a power of two: past tiny's 2048
    positions, so RoPE is stretched, as train/engine/model.py will; train.toml holds the number. One sequence
    per micro-batch and a second 300-word document: else the rows pack into one micro-batch, too few for
    one step on two ranks (refused)."""
    run = _local(tmp_path, [*ROWS, LONG[1]], "train.per_device_train_batch_size=1")
    auto, length = run.launch.auto_length, run.launch.train.train.model_max_length
    assert auto is not None and length == auto.tokens == datasize.holding_length(auto.longest) and length > 2048
    assert (f"Length  model_max_length auto: {length}, the longest document ~{auto.longest:,} tokens (counted with "
            "tiny-tokenizer's tokenizer on all 44 rows)") in run.text.splitlines()
    assert f"RoPE    stretched x{length // 2048} (linear): the model's 2,048 positions -> model_max_length " \
           f"{length:,}" in run.text.splitlines()
    assert "longer than model_max_length" not in run.text
    assert tomllib.loads(run.files["train.toml"])["train"]["model_max_length"] == length
    assert record_fields(run.launch)["model_max_length_auto"] == auto.record()


def test_auto_stays_at_the_default_for_short_documents_and_stops_at_its_bound(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    short = _local(tmp_path / "short", ROWS[3:])
    assert short.launch.train.train.model_max_length == 256  # tiny's default
    assert "; never below the default 256" in short.text and "RoPE" not in short.text
    monkeypatch.setattr(max_length, "AUTO_MAX_LENGTH", 1024)
    bound = _local(tmp_path / "bound", ROWS)
    assert bound.launch.train.train.model_max_length == 1024
    assert "; at most 1024: longer documents are cut to it" in bound.text
    assert "document(s) longer than model_max_length 1024" in bound.text  # the warning counts what is cut


def test_train_refuses_a_train_toml_that_still_says_auto(tmp_path: Path) -> None:
    (tmp_path / "train.toml").write_text('[model]\narch = {hidden_size = 64}\n[train]\nmodel_max_length = "auto"\n')
    with pytest.raises(ConfigError, match="train.model_max_length = 'auto' is resolved by sft-launch"):
        load_train_config(tmp_path / "train.toml")


def test_auto_keeps_documents_whole_only_where_the_data_raised_the_length(tmp_path: Path) -> None:
    """The headline plan with auto is today's (the shipped sample's documents are short: the default stays and
    the micro-batch fit may go below it); raised by a 12k-token document, the fit keeps documents whole."""
    from tests.launcher.conftest import EXAMPLE_CLUSTER

    def headline(**kw: object):
        return resolve(LaunchRequest(model="llama-70b", nodes=2, cluster=str(EXAMPLE_CLUSTER), **kw))

    auto = headline(train_flags={"model_max_length": "auto"})
    assert auto.micro_batch is not None and auto.micro_batch.record() == headline().micro_batch.record()
    rows = [{"question": "Recite it all.", "answer": "lorem ipsum dolor " * 2500}, *ROWS[3:]]
    raised = headline(train_flags={"model_max_length": "auto"}, data=_jsonl(tmp_path, rows))
    assert raised.train.train.model_max_length == 16384 and raised.auto_length.raised
    assert raised.micro_batch is not None and not raised.micro_batch.rules.cut_documents
