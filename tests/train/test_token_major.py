"""Token-major Llama attention (train/kernels/token_major.py) against transformers' own forward, on CPU.

Both sides call the same varlen kernel: transformers' forward through our attention-function wrapper
(its q, k, v transposed head-major and back), ours with q, k, v token-major from the projections on.
The varlen kernels themselves are CUDA-only; here a per-document causal sdpa stands in for them, and
tests/train/test_gpu.py repeats the comparison with the real kernels.
"""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaAttention

from train.dataset.packing import collate_packed
from train.kernels.attention import transformers_attention
from train.kernels.token_major import use_token_major_attention

PER_DOCUMENT = "sft_test_per_document"


def per_document_kernel(q, k, v, cu_q, cu_k, max_q, max_k, scaling, dropout):
    """A varlen kernel's contract on CPU: [T, H, D] in, causal attention inside each document, GQA."""
    outs = []
    for start, end in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))
        repeat = qd.shape[0] // kd.shape[0]
        kd, vd = kd.repeat_interleave(repeat, 0), vd.repeat_interleave(repeat, 0)
        out = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scaling)
        outs.append(out.transpose(0, 1))
    return torch.cat(outs)


def _loss_and_grads(model, inputs):
    model.zero_grad()
    logits = model(**inputs).logits
    loss = logits.float().pow(2).mean()
    loss.backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_token_major_forward_matches_transformers_values_and_gradients(tiny_model_config):
    AttentionInterface.register(PER_DOCUMENT, transformers_attention(per_document_kernel))
    tiny_model_config._attn_implementation = PER_DOCUMENT
    torch.manual_seed(0)
    stock = LlamaForCausalLM(tiny_model_config).to(torch.bfloat16)  # the kernels take bf16/fp16 only
    ours = copy.deepcopy(stock)
    attentions = [layer.self_attn for layer in ours.model.layers]
    assert use_token_major_attention(attentions, per_document_kernel) == tiny_model_config.num_hidden_layers
    docs = [torch.randint(0, tiny_model_config.vocab_size, (n,)).tolist() for n in (5, 11, 1, 8)]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    inputs = {k: v for k, v in batch.items() if k != "labels"}

    want_logits, want_grads = _loss_and_grads(stock, inputs)
    got_logits, got_grads = _loss_and_grads(ours, inputs)
    assert torch.equal(got_logits, want_logits)  # the same arithmetic in another memory order: bitwise, eager
    assert got_grads.keys() == want_grads.keys()
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name


def test_only_plain_llama_attention_is_rerouted(tiny_model_config):
    class OtherAttention(LlamaAttention):  # a model family of its own (extra norms, windows): left alone
        pass

    plain, other = LlamaAttention(tiny_model_config, 0), OtherAttention(tiny_model_config, 1)
    assert use_token_major_attention([plain, other], per_document_kernel) == 1
    assert "forward" in vars(plain) and "forward" not in vars(other)
