"""QLoRA's NF4 linears (train/engine/qlora.py NF4Linear) inside torch.compile'd decoder layers save the bf16
expansion of every target weight for the backward, where eager layers save the NF4 weight itself (no copy) and
expand it again: launcher/plan/activations.py `dequantized_weight_bytes` counts one layer's copies for each layer
left uncheckpointed and for the layer being recomputed. On CPU, a tiny bf16 Llama without checkpointing: the saved
tensors shaped like a target weight are exactly those copies, as the planner counts them."""

from __future__ import annotations

import collections
import types

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bench.multi.gpu_qlora import TINY_QLORA
from contract.shape import LORA_TARGETS, ModelShape
from launcher.plan.activations import dequantized_weight_bytes
from launcher.plan.memory import MemoryOptions
from train.engine.qlora import BLOCK_SIZE, SCALER_BLOCK_SIZE, _nf4_linear_forward, nf4_api
from train.kernels.perf import compile_decoder_layers

TOKENS = 320  # no dimension of a weight: an activation never has a weight's shape


def _quantized_model(compiled: bool) -> torch.nn.Module:
    """TINY_QLORA in bf16 with every target linear in NF4, as build_quantized_model sets it up."""
    _, to_nf4 = nf4_api()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_QLORA, attn_implementation="sdpa", use_cache=False))
    model = model.to(torch.bfloat16)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS:
            module.weight = torch.nn.Parameter(to_nf4(module.weight.data, BLOCK_SIZE, SCALER_BLOCK_SIZE),
                                               requires_grad=False)
            module.forward = types.MethodType(_nf4_linear_forward, module)
    model.model.embed_tokens.weight.requires_grad_(True)  # a graph to save for: the base is frozen
    if compiled:
        compile_decoder_layers(model)
    return model.train()


def _saved_weight_shaped(model: torch.nn.Module) -> collections.Counter[tuple[int, ...]]:
    """The saved bf16 tensors of one forward that have a target weight's shape, distinct storages, by shape."""
    shapes = {tuple(m.weight.shape) for n, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in LORA_TARGETS}
    seen: dict[int, tuple[int, ...]] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if not hasattr(tensor, "quantized_data") and tuple(tensor.shape) in shapes:
            seen[tensor.untyped_storage().data_ptr()] = tuple(tensor.shape)
        return tensor

    ids = torch.randint(0, TINY_QLORA["vocab_size"], (1, TOKENS), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids, labels=ids).loss.backward()
    return collections.Counter(seen.values())


@pytest.mark.slow
def test_compiled_qlora_layers_keep_the_bf16_weights_the_planner_counts():
    torch._dynamo.reset()
    try:
        eager, compiled = _saved_weight_shaped(_quantized_model(False)), _saved_weight_shaped(_quantized_model(True))
    finally:
        torch._dynamo.reset()
    assert not eager, eager  # eager layers keep the NF4 weight and expand it again in the backward
    shape = ModelShape.from_arch(TINY_QLORA)
    per_layer = collections.Counter((n_out, n_in) for n_in, n_out in shape.linear_dims(list(LORA_TARGETS)))
    assert compiled == collections.Counter({s: count * shape.layers for s, count in per_layer.items()}), compiled
    saved = sum(2 * rows * cols * count for (rows, cols), count in compiled.items())
    options = MemoryOptions(strategy="fsdp", world_size=1, gpus_per_node=1, nodes=1, micro_batch_tokens=TOKENS,
                            gradient_checkpointing=False, cpu_offload=False, precision="bf16", lora=True, lora_r=16,
                            lora_target_modules=list(LORA_TARGETS), lora_dropout=0.0, loss_chunk_tokens=0,
                            hold_outputs=False, cpu_ram_efficient_loading=True, device="cpu", quant="nf4",
                            compile=True)
    assert saved == shape.layers * dequantized_weight_bytes(shape, options, elem=2)
