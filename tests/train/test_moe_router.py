"""The router as the model defines it (train/moe/router.py), in process on a tiny Qwen3-MoE: the family's
load-balancing loss added once per forward (config coefficient, override, 0 = off) through our fused loss
forward, fp32 routing under bf16 autocast, and the per-layer expert load."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from train.kernels.perf import use_fused_loss
from train.moe.router import RouterLoss, router_loss_of

ARCH = dict(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_experts=4,
            num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            router_aux_loss_coef=0.02)


def tiny() -> Qwen3MoeForCausalLM:
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**ARCH))
    for layer in model.model.layers:
        torch.nn.init.normal_(layer.mlp.gate.weight, std=0.5)  # a router that prefers some experts
    return model


@pytest.mark.parametrize("override, coef", [(None, 0.02), (0.5, 0.5), (0.0, 0.0)])
def test_the_aux_loss_is_added_once_with_the_coefficient_per_micro_batch(override, coef, caplog):
    plain, model = tiny(), tiny()
    use_fused_loss(plain, "chunked")
    use_fused_loss(model, "chunked")
    with caplog.at_level(logging.INFO, logger="train.moe.router"):
        book = RouterLoss.install(model, override, micro_batches=2)
    assert router_loss_of(model) is book and book.coef == coef
    assert ("off" in caplog.text) == (coef == 0) and "routers in fp32: 2 layers" in caplog.text
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=ids, labels=ids)
    token_loss = plain(input_ids=ids, labels=ids).loss
    aux = load_balancing_loss_func(plain.model(input_ids=ids, output_router_logits=True).router_logits, 4, 2, None)
    torch.testing.assert_close(out.aux_loss, aux)
    torch.testing.assert_close(out.loss, token_loss + coef / 2 * aux)
    record = book.drain()
    assert record["aux_loss"] == pytest.approx(float(aux), abs=1e-6)
    assert len(record["expert_load_min"]) == 2 and all(lo <= 0.25 <= hi for lo, hi in
                                                       zip(record["expert_load_min"], record["expert_load_max"]))
    assert book.drain() == {}  # reset


def test_routing_runs_in_fp32_under_bf16_autocast_and_eval_adds_nothing():
    model = tiny()
    reference = copy.deepcopy(model)
    RouterLoss.install(model, None, micro_batches=1)
    hidden = torch.randn(10, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, weights, index = model.model.layers[0].mlp.gate(hidden)
    assert logits.dtype == weights.dtype == torch.float32
    ref_logits, ref_weights, ref_index = reference.model.layers[0].mlp.gate(hidden)  # fp32 reference, no autocast
    torch.testing.assert_close(logits, ref_logits)
    assert torch.equal(index, ref_index)
    model.eval()
    ids = torch.randint(0, 128, (1, 8))
    assert model(input_ids=ids, labels=ids).aux_loss is None
