"""LoRA run with an eval split: eval loss is reported, and the export (merged model + adapter) loads
and generates."""

import json

import pytest
from tests.train.run_helpers import metrics, read_log, run_training, write_run

pytestmark = pytest.mark.slow


def test_lora_run_with_eval_exports_merged_model_and_adapter(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir = write_run(tmp_path / "run", {
        "lora": {"enabled": True, "r": 4, "alpha": 8, "merge_on_export": True},
        "data": {"eval_fraction": 0.1},
        "train": {"max_steps": 6, "eval_steps": 3, "logging_steps": 3},
    })
    assert run_training(run_dir) == 0, read_log(run_dir)
    assert "trainable of" in read_log(run_dir)
    evals = [r["eval_loss"] for r in metrics(run_dir) if "eval_loss" in r]
    assert len(evals) == 3 and all(v > 0 for v in evals)  # steps 3, 6 and the final eval

    export = run_dir / "export"
    adapter = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (export / "adapter" / "adapter_model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(export)
    model = AutoModelForCausalLM.from_pretrained(export)
    assert not any("lora" in name for name, _ in model.named_parameters())  # merged
    ids = tokenizer("hello", return_tensors="pt")
    assert model.generate(**ids, max_new_tokens=4, do_sample=False).shape[1] > ids["input_ids"].shape[1]
