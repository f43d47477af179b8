"""QLoRA state-dict keys. A resume loads the adapters, not the frozen NF4 base weights (train/engine/qlora.py
keep_built_weights_on_load): loading a state dict leaves the built NF4 weight untouched, loads the rest,
and a strict load does not report the skipped weight as missing. The export's state dict has every key,
the NF4 weights dequantized (or left out for an adapter-only export)."""

from __future__ import annotations

import pytest
import torch

from train.engine import qlora


def _nf4_model() -> torch.nn.Sequential:
    """An NF4 linear (no bias) and a plain one, as build_quantized_model makes them."""
    pytest.importorskip("torchao")
    _, to_nf4 = qlora.nf4_api()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128, bias=False), torch.nn.Linear(128, 4))
    model[0].weight = torch.nn.Parameter(to_nf4(model[0].weight.data, qlora.BLOCK_SIZE, qlora.SCALER_BLOCK_SIZE),
                                         requires_grad=False)
    return model


def test_nf4_weight_is_kept_and_the_rest_loads():
    model = _nf4_model()
    built = qlora.dequantize(model[0].weight, torch.float32).clone()
    qlora.keep_built_weights_on_load(model)

    other = {"0.weight": torch.zeros(128, 128), "1.weight": torch.ones(4, 128), "1.bias": torch.full((4,), 2.0)}
    result = model.load_state_dict(other, strict=True)

    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(qlora.dequantize(model[0].weight, torch.float32), built)
    assert torch.equal(model[1].weight, torch.ones(4, 128)) and torch.equal(model[1].bias, torch.full((4,), 2.0))
    with pytest.raises(RuntimeError, match="Missing key"):  # other keys still count as missing
        model.load_state_dict({"1.weight": torch.ones(4, 128)}, strict=True)


def test_export_state_dict_holds_nf4_weights_dequantized_or_leaves_them_out():
    """The export's state dict (qlora.full_state_dict) keeps every key of the model's own: an NF4 weight
    comes back dequantized to the asked dtype (the merge), or is left out (an adapter-only export)."""
    from accelerate import Accelerator

    model = _nf4_model()
    nf4_tensor, _ = qlora.nf4_api()
    accelerator = Accelerator(cpu=True)

    state = qlora.full_state_dict(accelerator, model, torch.float32)
    assert list(state) == list(model.state_dict())
    assert type(state["0.weight"]) is torch.Tensor
    assert torch.equal(state["0.weight"], qlora.dequantize(model[0].weight, torch.float32))
    assert torch.equal(state["1.weight"], model[1].weight)
    assert list(qlora.full_state_dict(accelerator, model, None)) == ["1.weight", "1.bias"]
    assert isinstance(model.state_dict()["0.weight"], nf4_tensor)  # only the export's state dict is changed
