"""The fused-loss forward and the fused q/k/v projections give the stock loss and gradients (packed
batch, num_items_in_batch)."""

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from train.packing import collate_packed
from train.perf import fuse_qkv_projections, qkv_fusable, use_fused_loss


def _packed_batch(vocab: int) -> dict:
    g = torch.Generator().manual_seed(0)
    docs = []
    for n in (7, 12, 5):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        labels = list(ids)
        labels[:2] = [-100, -100]  # a prompt without loss
        docs.append({"input_ids": ids, "labels": labels})
    return collate_packed(docs)


def test_fused_loss_matches_stock_loss_and_grads(tiny_model_config):
    torch.manual_seed(0)
    stock = LlamaForCausalLM(tiny_model_config).double()
    fused = copy.deepcopy(stock)
    use_fused_loss(fused)
    batch = _packed_batch(tiny_model_config.vocab_size)
    for items in (None, torch.tensor(9.0, dtype=torch.float64)):
        ref = stock(**batch, num_items_in_batch=items).loss
        got = fused(**batch, num_items_in_batch=items).loss
        torch.testing.assert_close(got, ref)
    ref.backward()
    got.backward()
    for (name, a), (_, b) in zip(stock.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_fused_forward_without_labels_returns_logits(tiny_model_config):
    model = LlamaForCausalLM(tiny_model_config)
    use_fused_loss(model)
    ids = torch.randint(0, tiny_model_config.vocab_size, (1, 6))
    out = model(input_ids=ids)
    assert out.logits.shape == (1, 6, tiny_model_config.vocab_size)
    assert set(model.state_dict()) == set(LlamaForCausalLM(tiny_model_config).state_dict())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_fused_qkv_matches_stock_loss_and_grads_on_a_packed_batch(tiny_model_config, attn):
    tiny_model_config._attn_implementation = attn
    tiny_model_config.use_cache = False  # as train.model builds it
    torch.manual_seed(0)
    stock = LlamaForCausalLM(tiny_model_config).double()
    fused = copy.deepcopy(stock)
    assert fuse_qkv_projections(list(fused.model.layers)) == tiny_model_config.num_hidden_layers
    batch = _packed_batch(tiny_model_config.vocab_size)
    ref, got = stock(**batch).loss, fused(**batch).loss
    torch.testing.assert_close(got, ref)
    ref.backward()
    got.backward()
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in stock.named_parameters()], "names unchanged"
    for (name, a), (_, b) in zip(stock.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_fused_qkv_leaves_lora_and_biased_projections_alone(tiny_model_config):
    from peft import LoraConfig, get_peft_model

    model = LlamaForCausalLM(tiny_model_config)
    model.model.layers[0].self_attn.k_proj.bias = torch.nn.Parameter(torch.zeros(model.model.layers[0].self_attn.k_proj.out_features))
    assert not qkv_fusable(model.model.layers[0].self_attn) and qkv_fusable(model.model.layers[1].self_attn)
    lora = get_peft_model(LlamaForCausalLM(tiny_model_config), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert fuse_qkv_projections(list(lora.get_base_model().model.layers)) == 0


def test_fused_qkv_refuses_a_kv_cache(tiny_model_config):
    model = LlamaForCausalLM(tiny_model_config)
    fuse_qkv_projections(list(model.model.layers))
    with pytest.raises(RuntimeError, match="no KV cache"):
        model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
