"""The planner and the launch with context parallelism (parallel.context, --context_parallel): each GPU holds
its share of the sequence plus the all-to-all buffers; a context-parallel group shares its micro-batches;
what would fit instead names --context_parallel; impossible splits are one line before anything is written."""

from __future__ import annotations

import dataclasses

import pytest

from contract.schema import ConfigError
from contract.shape import ModelShape
from launcher.plan.activations import all_to_all_bytes
from launcher.plan.memory import low_bytes
from launcher.plan.plan_format import suggestion_flags
from launcher.plan.planner import PlanInput, make_plan, memory_options
from launcher.resolve.options import LaunchRequest, resolve
from tests.launcher.conftest import EXAMPLE_CLUSTER
from tests.launcher.test_planner import LLAMA3_8B

LONG = PlanInput(arch=LLAMA3_8B, gpus_per_node=8, gpu_type="h200", lora=True, micro_batch_tokens=524288,
                 loss_chunk_tokens=4096, compile=True)


def test_each_gpu_holds_its_share_of_the_sequence_plus_the_all_to_all_buffers():
    split = make_plan(dataclasses.replace(LONG, context_parallel=4))
    share = make_plan(dataclasses.replace(LONG, micro_batch_tokens=524288 // 4))
    assert split.gpu.activations == share.gpu.activations and split.gpu.logits_loss == share.gpu.logits_loss
    shape, opts = ModelShape.from_arch(LLAMA3_8B), memory_options(split.input)
    # 131,072 tokens a GPU, q/k/v/out both layouts: 2 B x (2 x 4096 + 2 x 8 KV heads x 128) per token, twice
    buffers = all_to_all_bytes(shape, opts, low_bytes(opts))
    assert buffers == 2 * 2 * 131072 * (2 * 4096 + 2 * 1024)
    assert split.gpu.comm_buffers == share.gpu.comm_buffers + buffers
    assert "1/4 of 524288" in split.gpu.notes["activations"] and "all-to-all" in split.gpu.notes["comm_buffers"]
    # fewer KV heads than ranks: each is repeated, so k and v carry N heads
    assert all_to_all_bytes(shape, memory_options(dataclasses.replace(LONG, context_parallel=16, gpus_per_node=16)),
                            2) == 2 * 2 * (524288 // 16) * (2 * 4096 + 2 * 16 * 128)
    # a group of 4 reads one micro-batch: a step has a quarter of the tokens
    assert split.time.tokens_per_step * 4 == make_plan(LONG).time.tokens_per_step


def test_what_would_fit_instead_names_context_parallel():
    long = make_plan(LONG)
    assert long.fits is False
    first = long.suggestions[0]
    assert first.change == {"context_parallel": 4} and suggestion_flags(first) == "--context_parallel 4"


def test_a_split_that_cannot_divide_the_heads_or_ranks_is_refused():
    with pytest.raises(ConfigError, match="context_parallel: 3 does not divide the 8 ranks"):
        make_plan(dataclasses.replace(LONG, context_parallel=3))
    with pytest.raises(ConfigError, match="64 does not divide the model's 32 attention heads"):
        make_plan(dataclasses.replace(LONG, context_parallel=64, gpus_per_node=64))


def test_the_launch_renders_parallel_context_and_refuses_what_cannot_split(tmp_path):
    launch = resolve(LaunchRequest(model="tiny", executor="local", context_parallel=2, output=str(tmp_path / "r")))
    assert launch.train.parallel.context == 2
    with pytest.raises(ConfigError, match=r"^--context_parallel 4: 4 does not divide the 2 ranks"):
        resolve(LaunchRequest(model="tiny", executor="local", context_parallel=4))
    with pytest.raises(ConfigError, match="--context_parallel 2: needs --strategy fsdp"):
        resolve(LaunchRequest(model="llama3-8b", cluster=str(EXAMPLE_CLUSTER), context_parallel=2, strategy="zero3"))
    with pytest.raises(ConfigError, match="parallel.context: context parallelism splits packed rows"):
        resolve(LaunchRequest(model="tiny", executor="local", context_parallel=2, sets=["data.packing=false"]))


def test_documents_longer_than_model_max_length_are_one_line_naming_what_keeps_them_whole():
    from launcher.commands.plan_cmd import long_documents
    from launcher.plan.datasize import DataEstimate

    plan = make_plan(dataclasses.replace(LONG, micro_batch_tokens=8192))
    data = DataEstimate(10**6, 100, "test", True, longer=3, longest=200_000, lengths="chars/3.5 of all 100 rows")
    assert long_documents(plan, data, 8192) == (
        "~3 document(s) longer than model_max_length 8192 (longest ~200,000 tokens; chars/3.5 of all 100 rows) are "
        "cut to it; "
        "whole with --model_max_length 262144 --context_parallel 2")
    assert long_documents(plan, DataEstimate(10**6, 100, "test", True), 8192) is None
    too_long = long_documents(plan, DataEstimate(10**7, 100, "test", True, longer=1, longest=5_000_000), 8192)
    assert too_long and too_long.endswith("a 8388608-token sequence does not fit even split over the node's 8 GPUs")


def test_activation_offload_moves_the_layer_inputs_to_the_host_and_mlp_chunks_bound_the_intermediate():
    one_gpu = dict(arch=LLAMA3_8B, gpus_per_node=1, gpu_type="h200", lora=True, micro_batch_tokens=262144,
                   loss_chunk_tokens=4096, compile=True, cpu_mem_per_node_gib=512)
    plain, offloaded = make_plan(PlanInput(**one_gpu)), make_plan(PlanInput(**one_gpu, activation_offload=True))
    inputs = 32 * 262144 * 2 * 4096  # every layer's bf16 input: 64 GiB
    assert plain.gpu.activations - offloaded.gpu.activations == inputs
    assert offloaded.cpu["offload"] - plain.cpu["offload"] == inputs
    chunked = make_plan(PlanInput(**one_gpu, activation_offload=True, mlp_chunk_tokens=8192))
    # compiled, stock MLP: gate, up and SiLU(gate) (3 x 2 B x 14,336 per token) for 8,192 tokens, not 262,144;
    # the backward's workspace likewise (3 x 2 B x 14,336)
    assert offloaded.gpu.activations - chunked.gpu.activations == (262144 - 8192) * 2 * 14336 * (3 + 3)
    assert plain.fits is False and chunked.fits is True  # 8B LoRA at 256k tokens on one H200
