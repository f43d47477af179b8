"""Memory for long sequences (train/kernels/long_context.py), on CPU in one process: offloading the saved
activations and chunking the MLP change where and when tensors live, never the loss or the gradients."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from train.dataset.packing import collate_packed
from train.kernels import long_context
from train.kernels.attention import setup_attention
from train.kernels.long_context import ActivationOffload, chunk_mlps
from train.kernels.perf import use_fused_loss


class CountingOffload(ActivationOffload):
    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.copied = 0

    def pack(self, tensor):
        packed = super().pack(tensor)
        self.copied += packed is not tensor
        return packed


def _loss_and_grads(config, batch, offload=None, chunk_tokens=0):
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    use_fused_loss(model, "chunked")
    if chunk_tokens:
        assert chunk_mlps([layer.mlp for layer in model.model.layers], chunk_tokens) == config.num_hidden_layers
    model.train()
    with offload.saving() if offload else torch.enable_grad():
        loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("offload, chunk_tokens", [(True, 0), (False, 16), (True, 16)])
def test_offload_and_mlp_chunks_keep_loss_and_gradients(tiny_model_config, monkeypatch, offload, chunk_tokens):
    monkeypatch.setattr(long_context, "OFFLOAD_MIN_BYTES", 0)  # the tiny model's activations are all small
    tiny_model_config._attn_implementation = setup_attention("sdpa", torch.device("cpu"), packed=True)
    torch.manual_seed(0)
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (13, 29, 7, 22)]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    want_loss, want = _loss_and_grads(tiny_model_config, batch)
    counting = CountingOffload() if offload else None
    loss, grads = _loss_and_grads(tiny_model_config, batch, counting, chunk_tokens)
    assert abs(loss.item() - want_loss.item()) < 1e-6
    assert max((grads[name] - grad).abs().max().item() for name, grad in want.items()) < 1e-5
    if counting:  # at least every checkpointed layer's input went through the copy
        assert counting.copied >= tiny_model_config.num_hidden_layers
