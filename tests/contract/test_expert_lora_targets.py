"""lora.target_modules may name the experts' weights and the router (contract.shape.EXPERT_LORA_TARGETS); what
PEFT and torchao cannot do with them is refused in one line naming the key."""

from __future__ import annotations

import pytest

from contract.config import LoraSection
from contract.schema import ConfigError

EXPERTS = ["q_proj", "experts.gate_up_proj", "experts.down_proj", "router"]


def test_expert_and_router_targets_are_valid_without_dropout():
    LoraSection(enabled=True, dropout=0.0, target_modules=EXPERTS).validate()


@pytest.mark.parametrize("settings, key, words", [
    (dict(dropout=0.05), "lora.dropout", "must be 0 when lora.target_modules names experts.gate_up_proj"),
    (dict(dropout=0.0, quant="nf4"), "lora.quant", "'nf4' cannot quantize experts.gate_up_proj"),
    (dict(dropout=0.0, target_modules=["experts.up_proj"]), "lora.target_modules", "unknown module 'experts.up_proj'"),
])
def test_what_cannot_run_is_refused_in_one_line(settings, key, words):
    with pytest.raises(ConfigError) as error:
        LoraSection(**{"enabled": True, "target_modules": EXPERTS, **settings}).validate()
    assert str(error.value).startswith(key) and words in str(error.value) and "\n" not in str(error.value)
