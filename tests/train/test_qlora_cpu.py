"""QLoRA on CPU (torchao's NF4Tensor under FSDP2 over gloo, 2 ranks): it trains (loss falls, finite
gradient norm), the NF4 weights stay NF4 after sharding, a stop request resumes bitwise, the
export holds the adapter in PEFT's format and a merged model that from_pretrained loads and that
generates, and one rank gives the same loss curve as two."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.train.conftest import TINY_TOKENIZER_DIR
from tests.train.run_helpers import REPO, exported_tensors, launch_env, metrics, read_log, run_training, write_run

from contract.protocol import EXIT_REQUEUE
from tests.faults import STOP_AT_STEP_ENV
from train.engine.checkpoint import MARKER

pytest.importorskip("torchao", reason="QLoRA needs torchao (the [qlora] extra)")
pytestmark = pytest.mark.slow

# Quantizable shapes: every target weight is a multiple of 64 x 256 elements per rank (train/engine/qlora.py).
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
    # A periodic save at step 10 (training goes on bitwise as without it): train.async_save meets the NF4 base.
    run_dir = write_run(tmp_path_factory.mktemp("qlora"), QLORA | {"train": {**QLORA["train"], "save_steps": 10}})
    assert run_training(run_dir) == 0, read_log(run_dir)
    return run_dir


def test_qlora_trains_and_exports_adapter_and_merged_model(reference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log = read_log(reference)
    assert "linear weights in NF4" in log and "DistributedType.FSDP" in log, log
    # train.async_save (the default): the NF4 base is not staged, so the saves are synchronous, and the log says why.
    assert "train.async_save: its state holds" in log and "checkpoints are written synchronously" in log, log
    assert (reference / "checkpoints" / "step-00000010" / MARKER).is_file()
    # The export's gather waits for every collective it starts (NF4 weights travel dequantized; the
    # NF4 subclass's own all-gather left 3 per weight in flight: train/engine/qlora.py full_state_dict).
    assert "unwaited collective" not in log, log[-3000:]
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


def _chat(model_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "train.chat_cli", "--model", str(model_dir), "--prompt", "hello",
                           "--max_new_tokens", "4"], cwd=REPO, env=launch_env(), capture_output=True, text=True,
                          timeout=120)


def test_chat_on_the_merged_export(reference):
    proc = _chat(reference / "export")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_pretrained_base_loaded_by_rank0_and_the_adapter_export_chats(tmp_path):
    """model.path: rank 0 reads the checkpoint and broadcasts it tensor by tensor, every rank quantizes;
    the adapter-only export names that base and from_pretrained (chat, lm-eval's HF backend) loads both."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    base = tmp_path / "base"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**QLORA_ARCH)).save_pretrained(base)
    AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR).save_pretrained(base)
    overrides = {"model": {"path": str(base), "arch": {}}, "lora": {**QLORA["lora"], "merge_on_export": False},
                 "train": QLORA["train"]}
    run_dir = write_run(tmp_path / "run", overrides)
    assert run_training(run_dir) == 0, read_log(run_dir)
    assert "linear weights in NF4" in read_log(run_dir)
    adapter = json.loads((run_dir / "export" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(base)
    proc = _chat(run_dir / "export")
    assert proc.returncode == 0, proc.stderr[-2000:]
