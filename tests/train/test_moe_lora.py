"""A tiny Qwen3-MoE LoRA run on CPU (2 ranks, FSDP2): adapters on the experts' stacked weights, the router and
attention; the router's load-balancing loss and the experts' load in metrics.jsonl; the merged export gives the
adapted model's logits; a stop and restart reproduce the uninterrupted run bitwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.faults import STOP_AT_STEP_ENV
from tests.train.conftest import TINY_TOKENIZER_DIR
from tests.train.run_helpers import exported_tensors, metrics, read_log, run_training, write_run

pytestmark = pytest.mark.slow

MOE_ARCH = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=512, tie_word_embeddings=False, router_aux_loss_coef=0.01)
TARGETS = ["q_proj", "experts.gate_up_proj", "experts.down_proj", "router"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = tmp_path_factory.mktemp("moe-base")
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE_ARCH)).save_pretrained(folder)
    for path in TINY_TOKENIZER_DIR.iterdir():
        shutil.copy(path, folder)
    return folder


def moe_run(run_dir: Path, base: Path, train: dict | None = None) -> Path:
    run_dir = write_run(run_dir, {
        "model": {"path": str(base), "arch": {}},
        "lora": {"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": TARGETS,
                 "merge_on_export": True},
        "train": {"max_steps": 6, "logging_steps": 3, "learning_rate": 1e-2, **(train or {})},
    })
    yaml = run_dir / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("LlamaDecoderLayer", "Qwen3MoeDecoderLayer"))
    return run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory, base) -> Path:
    run_dir = moe_run(tmp_path_factory.mktemp("moe-reference"), base)
    assert run_training(run_dir) == 0, read_log(run_dir)
    return run_dir


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_expert_lora_trains_with_the_router_loss_and_reports_the_load(reference):
    log = read_log(reference)
    assert "LoRA on the experts: 4 stacked expert weights, rank 4 per expert" in log
    assert "router load-balancing loss: coefficient 0.01 (the model config's); routers in fp32: 2 layers" in log
    records = [r for r in metrics(reference) if "loss" in r]
    assert len(records) == 2
    for record in records:
        assert len(record["expert_load_min"]) == len(record["expert_load_max"]) == 2  # per layer
        assert all(0 <= low <= 0.25 <= high <= 1 for low, high in zip(record["expert_load_min"],
                                                                        record["expert_load_max"]))
        assert record["aux_loss"] > 0
    adapter = load_file(reference / "export" / "adapter" / "adapter_model.safetensors")
    expert_b = [name for name in adapter if "experts" in name and "lora_B" in name]
    assert len(expert_b) == 4 and all(adapter[name].abs().max() > 0 for name in expert_b), "experts left frozen"
    assert any("mlp.gate" in name for name in adapter)


def test_the_merged_export_gives_the_adapted_models_logits(reference, base):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from train.moe.hf import adapt_experts_in_place, use_grouped_experts

    export = reference / "export"
    assert json.loads((export / "adapter" / "adapter_config.json").read_text())["r"] == 4
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    use_grouped_experts(model)
    adapted = PeftModel.from_pretrained(model, export / "adapter")
    assert adapt_experts_in_place(adapted) == 4  # our grouped path reads the exported adapter
    adapted.eval()
    untrained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    ids = torch.randint(0, MOE_ARCH["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(1))
    got, want = _logits(merged, ids), _logits(adapted, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - _logits(untrained, ids)).abs().max() > 1e-3, "the merged export is the untrained base"


def test_stop_and_resume_reproduce_the_run_bitwise(tmp_path, reference, base):
    run_dir = moe_run(tmp_path / "run", base, {"save_steps": 3})
    assert run_training(run_dir, {STOP_AT_STEP_ENV: "4"}, log_name="first.log") != 0
    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    assert "resumed from" in read_log(run_dir, "second.log")
    losses = {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}
    assert losses == {r["step"]: r["loss"] for r in metrics(reference) if "loss" in r}
    got, want = exported_tensors(run_dir), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), f"{name} differs from the uninterrupted run"
