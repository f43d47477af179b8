"""QLoRA on CPU (torchao's NF4Tensor under FSDP2 over gloo, 2 ranks): it trains (loss falls, finite
gradient norm), the NF4 weights stay NF4 after sharding, a stop request resumes bitwise, the
export holds the adapter in PEFT's format and a merged model that from_pretrained loads and that
generates, and one rank gives the same loss curve as two."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.train.run_helpers import exported_tensors, metrics, read_log, run_training, write_run

from contract.protocol import EXIT_REQUEUE
from tests.faults import STOP_AT_STEP_ENV
from train.checkpoint import MARKER

pytest.importorskip("torchao", reason="QLoRA needs torchao (the [qlora] extra)")
pytestmark = pytest.mark.slow

# Quantizable shapes: every target weight is a multiple of 64 x 256 elements per rank (train/qlora.py).
QLORA_ARCH = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
              "tie_word_embeddings": False}
QLORA = {"model": {"arch": QLORA_ARCH}, "lora": {"enabled": True, "quant": "nf4", "r": 8, "alpha": 16,
                                                "merge_on_export": True, "dropout": 0.0},
         "train": {"max_steps": 20, "learning_rate": 3e-3, "logging_steps": 1}}


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = write_run(tmp_path_factory.mktemp("qlora"), QLORA)
    assert run_training(run_dir) == 0, read_log(run_dir)
    return run_dir


def test_qlora_trains_and_exports_adapter_and_merged_model(reference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log = read_log(reference)
    assert "linear weights in NF4" in log and "DistributedType.FSDP" in log, log
    records = [r for r in metrics(reference) if "loss" in r]
    assert all(torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all() for r in records)
    assert records[-1]["loss"] < records[0]["loss"] - 0.5, [r["loss"] for r in records]

    export = reference / "export"
    adapter = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 8
    assert sorted(adapter["target_modules"]) == sorted(QLORA_LORA_TARGETS)
    from safetensors.torch import load_file

    adapter_tensors = load_file(export / "adapter" / "adapter_model.safetensors")
    assert adapter_tensors and all("lora_" in key for key in adapter_tensors)
    merged = exported_tensors(reference)
    assert not any("lora" in key for key in merged) and "model.layers.0.self_attn.q_proj.weight" in merged
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export)
    ids = tokenizer("hello", return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] > ids["input_ids"].shape[1]


QLORA_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def test_qlora_stop_and_resume_is_bitwise(tmp_path, reference):
    run_dir = write_run(tmp_path / "run", QLORA)
    code = run_training(run_dir, {STOP_AT_STEP_ENV: "8"}, log_name="first.log")
    assert code in (EXIT_REQUEUE, 1) and "exitcode  : 75" in read_log(run_dir, "first.log")
    assert (run_dir / "checkpoints" / "step-00000008" / MARKER).is_file()
    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    assert "resumed from" in read_log(run_dir, "second.log")
    assert losses(run_dir) == losses(reference)
    got, want = exported_tensors(run_dir), exported_tensors(reference)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_qlora_one_rank_matches_two(tmp_path, reference):
    """The same job on one process (no sharding): the same loss curve within 1e-2 (CPU: the two runs
    differ only in the order of the gradient reductions)."""
    run_dir = write_run(tmp_path / "one", QLORA | {"train": {**QLORA["train"], "gradient_accumulation_steps": 4}},
                        processes=1)
    assert run_training(run_dir) == 0, read_log(run_dir)
    one, two = losses(run_dir), losses(reference)
    assert one.keys() == two.keys()
    assert max(abs(one[s] - two[s]) for s in one) < 1e-2, (one, two)
