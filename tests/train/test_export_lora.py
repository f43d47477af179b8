"""LoRA run with an eval split, from a saved base checkpoint: eval loss is reported, and the export's
merged model gives the outputs PEFT's own merge_and_unload gives for the base + the exported adapter,
which are not the base model's (the adapter learned something); the merged model generates."""

import json
import shutil

import pytest
import torch
from tests.train.conftest import TINY_ARCH, TINY_TOKENIZER_DIR
from tests.train.run_helpers import metrics, read_log, run_training, write_run

pytestmark = pytest.mark.slow


def _save_base(folder) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_ARCH)).save_pretrained(folder)
    for path in TINY_TOKENIZER_DIR.iterdir():
        shutil.copy(path, folder)


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_lora_run_with_eval_exports_the_merge_peft_makes(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "base"
    _save_base(base)
    run_dir = write_run(tmp_path / "run", {
        "model": {"path": str(base)},
        "lora": {"enabled": True, "r": 4, "alpha": 8, "merge_on_export": True},
        "data": {"eval_fraction": 0.1},
        "train": {"max_steps": 6, "eval_steps": 3, "logging_steps": 3},
    })
    assert run_training(run_dir) == 0, read_log(run_dir)
    assert "trainable of" in read_log(run_dir)
    evals = [r["eval_loss"] for r in metrics(run_dir) if "eval_loss" in r]
    assert len(evals) == 2 and all(v > 0 for v in evals)  # steps 3 and 6: the final eval is step 6's, recorded once

    export = run_dir / "export"
    adapter = json.loads((export / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (export / "adapter" / "adapter_model.safetensors").is_file()
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                          export / "adapter").merge_and_unload().eval()
    untrained = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    ids = torch.randint(0, TINY_ARCH["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(1))
    got, want = _logits(merged, ids), _logits(reference, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - _logits(untrained, ids)).abs().max() > 1e-3, "the merged export is the untrained base"

    tokenizer = AutoTokenizer.from_pretrained(export)
    prompt = tokenizer("hello", return_tensors="pt")
    assert merged.generate(**prompt, max_new_tokens=4, do_sample=False).shape[1] > prompt["input_ids"].shape[1]
