"""train.recompute_attention = false (train/kernels/keep_attention.py), on CPU in one process: per-layer
checkpointing keeps the attention op's outputs from the forward, so the op runs once per layer per step
instead of twice, and the loss and gradients are exactly the plain checkpointed run's (fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface, LlamaForCausalLM

from tests.train.test_long_context import CountingOffload
from train.dataset.packing import collate_packed
from train.kernels import keep_attention, long_context
from train.kernels.attention import block_causal_mask, document_ids, setup_attention
from train.kernels.keep_attention import ATTENTION_OPS, checkpoint_kwargs, op_name
from train.kernels.long_context import chunk_mlps
from train.kernels.perf import compile_decoder_layers, compiled_graphs, use_fused_loss

STAND_IN_CALLS = {"forward": 0}


@torch.library.custom_op("sft_test::attention", mutates_args=())
def stand_in_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention kernel as FA4's op looks to the checkpoint: one custom op returning output and LSE."""
    STAND_IN_CALLS["forward"] += 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return out, torch.zeros(q.shape[:3])  # a log-sum-exp's shape


@stand_in_attention.register_fake
def _stand_in_fake(q, k, v, mask):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _stand_in_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _stand_in_backward(ctx, dout, dlse):
    q, k, v, mask = ctx.saved_tensors
    with torch.enable_grad():
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return *torch.autograd.grad(out, (q, k, v), dout), None


stand_in_attention.register_autograd(_stand_in_backward, setup_context=_stand_in_setup)


def _stand_in_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    batch, _, length, _ = query.shape
    out, _ = stand_in_attention(query, key, value, block_causal_mask(document_ids(kwargs, batch, length, query.device)))
    return out.transpose(1, 2).contiguous(), None


class AttentionOpCounter(TorchDispatchMode):
    """The attention ops that actually execute (a kept output read back by the recompute does not run)."""

    def __init__(self) -> None:
        super().__init__()
        self.forward = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.forward += op_name(func) in ATTENTION_OPS
        return func(*args, **(kwargs or {}))


def _batch():
    torch.manual_seed(0)
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (13, 29, 7, 22)]
    return collate_packed([{"input_ids": d, "labels": d} for d in docs])


def _step(config, batch, recompute_attention: bool, offload=None, chunk_tokens: int = 0):
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(recompute_attention))
    use_fused_loss(model, "chunked")
    if chunk_tokens:
        chunk_mlps([layer.mlp for layer in model.model.layers], chunk_tokens)
    model.train()
    counter = AttentionOpCounter()
    with counter, offload.saving() if offload else torch.enable_grad():
        loss = model(**batch).loss
    with counter:
        loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, counter.forward


@pytest.mark.parametrize("offload, chunk_tokens", [(False, 0), (True, 0), (False, 16)])
def test_kept_attention_runs_once_per_layer_with_the_same_gradients(tiny_model_config, monkeypatch, offload,
                                                                    chunk_tokens):
    """The CPU block-diagonal path (aten._scaled_dot_product_flash_attention_for_cpu); with the activation
    offload's hooks and the chunked MLP's nested checkpoints. The offload copies exactly what it copied
    before: the kept outputs stay with the checkpoint (on the GPU there)."""
    monkeypatch.setattr(long_context, "OFFLOAD_MIN_BYTES", 0)
    tiny_model_config._attn_implementation = setup_attention("sdpa", torch.device("cpu"), packed=True)
    batch, layers = _batch(), tiny_model_config.num_hidden_layers
    offloads = [CountingOffload() if offload else None for _ in range(2)]
    want_loss, want, recomputed = _step(tiny_model_config, batch, True, offloads[0], chunk_tokens)
    loss, grads, kept = _step(tiny_model_config, batch, False, offloads[1], chunk_tokens)
    assert (recomputed, kept) == (2 * layers, layers)
    assert torch.equal(loss, want_loss)
    assert all(torch.equal(grads[name], grad) for name, grad in want.items())
    if offload:
        assert offloads[1].copied == offloads[0].copied


def test_a_custom_op_kernel_runs_once_per_layer(tiny_model_config, monkeypatch):
    """A registered custom op with its own autograd, as FA4's torch.ops.sft.fa4_varlen_fwd is: the
    checkpoint sees it and keeps its outputs (counted in the op's own body, not through a dispatch mode)."""
    monkeypatch.setattr(keep_attention, "ATTENTION_OPS", ATTENTION_OPS | {"sft_test.attention"})
    AttentionInterface.register("sft_test_attention", _stand_in_forward)
    tiny_model_config._attn_implementation = "sft_test_attention"
    batch, layers, runs = _batch(), tiny_model_config.num_hidden_layers, {}
    for recompute in (True, False):
        STAND_IN_CALLS["forward"] = 0
        runs[recompute] = _step(tiny_model_config, batch, recompute)
        runs[recompute] = (*runs[recompute][:2], STAND_IN_CALLS["forward"])
    assert (runs[True][2], runs[False][2]) == (2 * layers, layers)
    assert torch.equal(runs[True][0], runs[False][0])
    assert all(torch.equal(runs[False][1][name], grad) for name, grad in runs[True][1].items())


def test_compiled_layers_keep_the_attention_op_once_per_layer(tiny_model_config, monkeypatch):
    """torch.compile'd decoder layers (train/kernels/perf.py): the checkpoint and its selective policy stay
    outside the compiled computation, and still keep the custom op's outputs (counted in its body, which the
    compiled graph calls; a dispatch mode would keep dynamo from compiling), with the eager run's gradients."""
    monkeypatch.setattr(keep_attention, "ATTENTION_OPS", ATTENTION_OPS | {"sft_test.attention"})
    AttentionInterface.register("sft_test_attention", _stand_in_forward)
    tiny_model_config._attn_implementation = "sft_test_attention"
    batch, layers, runs = _batch(), tiny_model_config.num_hidden_layers, {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # compiled_graphs() counts this test's graphs only
    try:
        for compiled, recompute in ((False, True), (True, True), (True, False)):
            torch.manual_seed(3)
            model = LlamaForCausalLM(tiny_model_config)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(recompute))
            if compiled:
                compile_decoder_layers(model)
            STAND_IN_CALLS["forward"] = 0
            model(**batch).loss.backward()
            runs[compiled, recompute] = ({n: p.grad for n, p in model.named_parameters()}, STAND_IN_CALLS["forward"])
        assert compiled_graphs() == 1
    finally:
        torch._dynamo.reset()
    assert (runs[True, True][1], runs[True, False][1]) == (2 * layers, layers)
    want = runs[False, True][0]
    for grads, _ in (runs[True, True], runs[True, False]):
        assert all(torch.allclose(grads[name], grad, atol=1e-6) for name, grad in want.items())


def test_the_policy_names_every_backends_forward_op():
    assert op_name(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default) in ATTENTION_OPS
    assert op_name(torch.ops.aten.mm.default) == "aten.mm" and "aten.mm" not in ATTENTION_OPS
    assert "sft.fa4_varlen_fwd" in ATTENTION_OPS  # train/kernels/fa4.py's op, registered only where CUDA runs it
    assert "use_reentrant" in checkpoint_kwargs(True) and "context_fn" not in checkpoint_kwargs(True)
