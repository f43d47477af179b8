"""Export round trip per family (tests/train/families.py): a model directory built as training builds it
(train/engine/model.py build_model from model.path, packed attention), its weights changed as training
would, exported by train/engine/export.py, loads in plain transformers (its own eager attention, no name of
ours in config.json) with logits equal to the trained model's on each document: full fine-tuning, and LoRA
merged on export."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract.config import TrainConfig
from tests.train.conftest import TINY_TOKENIZER_DIR
from tests.train.families import FAMILIES, family_config
from train.dataset.packing import collate_packed
from train.engine.export import export_model
from train.engine.model import attention_features, build_model
from train.kernels.attention import setup_attention

DOC_LENGTHS = (11, 6)


def _base_dir(tmp_path, family: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(family))
    model.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def _config(tmp_path, family: str, lora: bool) -> TrainConfig:
    cfg = TrainConfig()
    cfg.model.path = str(_base_dir(tmp_path, family))
    cfg.model.precision = "no"
    cfg.run.dir = str(tmp_path / "run")
    cfg.train.model_max_length = 64
    cfg.lora.enabled = cfg.lora.merge_on_export = lora
    cfg.lora.dropout = 0.0
    return cfg


def _as_trained(model: torch.nn.Module) -> None:
    """Change every trainable weight (LoRA's B starts at zero: the merge would be a no-op)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora-merged"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_loads_in_transformers_with_the_trained_logits(tmp_path, family, lora):
    cfg = _config(tmp_path, family, lora)
    accelerator = Accelerator(cpu=True)
    attn = setup_attention("sdpa", accelerator.device, packed=True, features=attention_features(cfg))
    model = build_model(cfg, accelerator, attn)
    _as_trained(model)
    model.eval()
    docs = [torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in DOC_LENGTHS]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    with torch.no_grad():
        trained = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR, local_files_only=True)
    out = export_model(accelerator, model, tokenizer, cfg)

    config = json.loads((out / "config.json").read_text())
    assert not any("sft_" in str(value) for value in config.values()), config
    exported = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", local_files_only=True).eval()
    assert type(exported).__name__ == type(model.get_base_model() if lora else model).__name__
    with torch.no_grad():
        separate = torch.cat([exported(input_ids=torch.tensor([d])).logits[0] for d in docs])
    torch.testing.assert_close(separate, trained, atol=1e-5, rtol=1e-5)
