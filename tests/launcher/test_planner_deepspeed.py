"""DeepSpeed terms of the memory model that the calibration points alone would not pin down: ZeRO-2
offload's gradients over reduce_bucket_size held through a non-boundary backward, and ZeRO-3's fp32
LoRA adapters (launcher/plan/peak.py, launcher/plan/memory.py; DeepSpeed 0.19 source)."""

from __future__ import annotations

import pytest

from contract.shape import ModelShape
from contract.strategies import zero_reduce_bucket_size
from launcher.plan.activations import lora_path_bytes_per_token
from launcher.plan.memory import adapter_bytes, trainable_params, trainable_tensor_sizes
from launcher.plan.peak import offload_held_gradients
from launcher.plan.planner import PlanInput, make_plan, memory_options

LLAMA3_8B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
ZERO2_OFFLOAD = dict(strategy="zero2", cpu_offload=True, gradient_accumulation_steps=2, nodes=1)


def held(arch=LLAMA3_8B, **kw) -> int:
    inp = PlanInput(arch=arch, **(ZERO2_OFFLOAD | kw))
    return offload_held_gradients(ModelShape.from_arch(arch), memory_options(inp))


@pytest.mark.parametrize("lora", [False, True])
def test_trainable_tensor_sizes_add_up_to_the_trainable_params(lora):
    inp = PlanInput(arch=LLAMA3_8B, lora=lora)
    shape, opts = ModelShape.from_arch(LLAMA3_8B), memory_options(inp)
    assert sum(trainable_tensor_sizes(shape, opts)) == trainable_params(shape, opts)


def test_zero2_offload_holds_the_gradients_over_one_bucket_in_bf16():
    # 8B: d^2 = 16.8M elements per bucket. Over it: gate/up/down (d x 14336) and the two embeddings;
    # q/o (exactly d^2), k/v and the norms go through the buckets.
    shape = ModelShape.from_arch(LLAMA3_8B)
    assert zero_reduce_bucket_size(shape.hidden) == 4096**2
    oversized = 3 * 32 * 4096 * 14336 + 2 * 128256 * 4096
    assert held(gpus_per_node=1) == 2 * oversized


def test_held_gradients_follow_the_partition_and_the_bucket_size():
    # Gradients outside a rank's partition are freed after their reduction: 1/P of them stay.
    assert held(gpus_per_node=8) == pytest.approx(held(gpus_per_node=1) / 8, abs=1)
    assert held(gpus_per_node=4, nodes=2) == pytest.approx(held(gpus_per_node=1) / 8, abs=1)
    # A wider model has a bigger bucket (hidden^2): an MLP no larger than it is no longer held.
    narrow_mlp = LLAMA3_8B | {"intermediate_size": 4096, "vocab_size": 4096}
    assert held(narrow_mlp, gpus_per_node=1) == 0
    assert held(narrow_mlp | {"intermediate_size": 4097}, gpus_per_node=1) == 2 * 3 * 32 * 4096 * 4097


@pytest.mark.parametrize("kw", [dict(gradient_accumulation_steps=1), dict(cpu_offload=False),
                                dict(strategy="zero3"), dict(lora=True)])
def test_nothing_is_held_without_offload_accumulation_or_oversized_gradients(kw):
    # Boundary micro-steps free each gradient once it is on the host; ZeRO-3 moves each partition into
    # its flat buffer; LoRA's adapters (r x 14336 at most) fit one bucket.
    assert held(gpus_per_node=1, **kw) == 0


def test_held_gradients_make_the_end_of_backward_the_peak():
    kw = dict(arch=LLAMA3_8B, gpus_per_node=2, gradient_checkpointing=True, micro_batch_tokens=4096,
              loss_chunk_tokens=1024)
    accumulating = make_plan(PlanInput(**(ZERO2_OFFLOAD | kw))).gpu
    stepping = make_plan(PlanInput(**(ZERO2_OFFLOAD | kw | {"gradient_accumulation_steps": 1}))).gpu
    assert accumulating.peak_phase == "backward/end" and accumulating.gradients == held(gpus_per_node=2)
    assert accumulating.allocated > stepping.allocated


@pytest.mark.parametrize(("strategy", "expected"), [("zero3", 4), ("zero2", 2), ("fsdp", 2)])
def test_lora_adapters_compute_in_fp32_only_under_zero3(strategy, expected):
    inp = PlanInput(arch=LLAMA3_8B, strategy=strategy, lora=True, gpus_per_node=8)
    assert adapter_bytes(memory_options(inp), 2) == expected


def test_fp32_adapters_save_their_wider_inputs_even_without_dropout():
    shape = ModelShape.from_arch(LLAMA3_8B)

    def per_token(strategy, dropout):
        inp = PlanInput(arch=LLAMA3_8B, strategy=strategy, lora=True, lora_dropout=dropout, gpus_per_node=8)
        return lora_path_bytes_per_token(shape, memory_options(inp), 2)

    inputs = 32 * (5 * 4096 + 4096 + 14336)  # q, k, v, gate, up read d; o reads q = d; down reads I
    assert per_token("zero2", 0.0) == 0
    assert per_token("zero2", 0.05) == 3 * inputs + 32 * 7 * 2 * 16  # bf16 output + bool mask; lora_A out
    assert per_token("zero3", 0.05) == 5 * inputs + 32 * 7 * 4 * 16
    assert per_token("zero3", 0.0) == 4 * inputs + 32 * 7 * 4 * 16  # PEFT's fp32 cast, saved by lora_A
