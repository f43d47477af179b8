"""train.recompute_attention = false on a GPU with FlashAttention-4 (train/kernels/keep_attention.py): the FA4
forward kernel runs once per layer per step (twice when the checkpoint recomputes it), eager and with
torch.compile'd layers, and the loss and gradients match recomputing within bf16 tolerance. Skipped without
CUDA (CI has none); on the GPU machine: python -m pytest -q tests/train/test_gpu_keep_attention.py"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.train.test_gpu import GPU_ARCH, _backend_or_skip
from train.dataset.packing import collate_packed
from train.kernels import fa4
from train.kernels.keep_attention import checkpoint_kwargs
from train.kernels.perf import compile_decoder_layers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")


class CountingInterface:
    """flash_attn.cute.interface with its forward entry point counted (every FA4 forward kernel launch)."""

    def __init__(self, interface):
        self.interface, self.forwards = interface, 0

    def _flash_attn_fwd(self, *args, **kwargs):
        self.forwards += 1
        return self.interface._flash_attn_fwd(*args, **kwargs)

    def _flash_attn_bwd(self, *args, **kwargs):
        return self.interface._flash_attn_bwd(*args, **kwargs)


def _step(name: str, batch: dict, recompute_attention: bool, compiled: bool, monkeypatch):
    counting = CountingInterface(fa4._interface())
    monkeypatch.setattr(fa4, "_interface", lambda: counting)
    torch.manual_seed(0)
    config = LlamaConfig(**GPU_ARCH)
    config._attn_implementation = name
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(recompute_attention))
    if compiled:
        compile_decoder_layers(model)
    model.train()
    loss = model(**batch).loss
    loss.backward()
    torch.cuda.synchronize()
    return loss.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()}, counting.forwards


@pytest.mark.parametrize("compiled", [False, True])
def test_fa4_forward_runs_once_per_layer_and_grads_match_recomputing(compiled, monkeypatch):
    name = _backend_or_skip("fa4")
    torch.manual_seed(1)
    docs = [torch.randint(0, GPU_ARCH["vocab_size"], (n,)).tolist() for n in (700, 33, 1024, 1, 290)]
    batch = {key: value.to("cuda") if isinstance(value, torch.Tensor) else value
             for key, value in collate_packed([{"input_ids": d, "labels": d} for d in docs]).items()}
    layers = GPU_ARCH["num_hidden_layers"]
    want_loss, want, recomputed = _step(name, batch, True, compiled, monkeypatch)
    loss, grads, kept = _step(name, batch, False, compiled, monkeypatch)
    assert (recomputed, kept) == (2 * layers, layers)
    assert abs(loss.item() - want_loss.item()) <= 1e-2 * abs(want_loss.item())
    for param, grad in want.items():
        scale = grad.abs().max().item() or 1.0
        assert (grads[param] - grad).abs().max().item() <= 2e-2 * scale, param
