"""The memory model at the 70B scale (issue #11), term by term: Llama-2-70B, FSDP2 full shard over
2 x 8 A100 80GB, bf16, per-layer checkpointing, a 2048-token micro-batch, the fused loss, fused AdamW.
The job the Llama-2-70B FSDP blog post trained; the planner must say it fits."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.plan.activations import layer_activation_bytes_per_token
from launcher.plan.memory import ALLOCATOR_SLACK, GIB
from launcher.plan.planner import PlanInput, make_plan
from launcher.resolve.presets import PRESETS
from contract.shape import ModelShape

LLAMA2_70B = dict(PRESETS["llama-70b"].arch)
SHAPE = ModelShape.from_arch(LLAMA2_70B)
BLOG_RUN = PlanInput(arch=LLAMA2_70B, nodes=2, gpus_per_node=8, gpu_type="a100", micro_batch_tokens=2048,
                     loss_chunk_tokens=4096)  # loss_chunk_tokens: what the launcher sets for the fused loss


def test_llama2_70b_shape() -> None:
    assert (SHAPE.layers, SHAPE.hidden, SHAPE.heads, SHAPE.kv_heads, SHAPE.intermediate, SHAPE.vocab) == (
        80, 8192, 64, 8, 28672, 32000)
    assert SHAPE.total_params == 68_976_648_192  # meta-llama/Llama-2-70b-hf


def test_blog_run_fits_term_by_term() -> None:
    plan = make_plan(BLOG_RUN)
    g, n, tokens = plan.gpu, SHAPE.total_params, 2048
    assert plan.fits is True and g.peak_phase == "backward/end"
    # sharded fp32 params (the master copy), fp32 gradient shards (all reduced by the first layer), AdamW m+v
    assert (g.parameters, g.gradients, g.optimizer_states, g.master_weights) == (
        pytest.approx(4 * n / 16, abs=16), pytest.approx(4 * n / 16, abs=16), pytest.approx(8 * n / 16, abs=16), 0)
    # layer 0's backward: its recomputed activations + the gradient workspace of one layer
    workspace = tokens * 2 * 3 * (SHAPE.intermediate + SHAPE.hidden)
    assert g.activations == tokens * layer_activation_bytes_per_token(SHAPE, 2) + workspace
    # bf16 layer in compute + the prefetched one + the unsharded gradient being reduce-scattered
    assert g.comm_buffers == 3 * 2 * SHAPE.layer_params
    assert g.logits_loss == 0 and g.optimizer_temporaries == 0  # fused loss holds no logits; fused AdamW
    assert g.cuda_context_nccl == int(1.25 * GIB)  # context + NCCL + the inter-node proxies
    assert 2.5 * GIB < g.allocator_slack < 2.7 * GIB  # the cached working set of the layers above
    assert 74.0 * GIB < g.total < 74.2 * GIB < plan.gpu_usable_bytes == 76 * GIB


def test_twice_the_micro_batch_does_not_fit() -> None:
    assert make_plan(dataclasses.replace(BLOG_RUN, micro_batch_tokens=4096)).fits is False


def test_fused_loss_holds_no_logits_even_when_the_micro_batch_is_one_chunk() -> None:
    fused = make_plan(BLOG_RUN).gpu
    unfused = make_plan(dataclasses.replace(BLOG_RUN, loss_chunk_tokens=0)).gpu
    assert fused.logits_loss == 0
    assert unfused.logits_loss == 2 * SHAPE.vocab * 2048  # the bf16 logits `outputs` keeps through backward


def test_allocator_floor_counts_only_what_each_step_allocates_and_frees() -> None:
    """ZeRO's reserved - allocated is the floor alone: a fraction of the activations, logits, gathered
    weights and temporaries, not of the params, master weights, moments and gradient partitions."""
    g = make_plan(dataclasses.replace(BLOG_RUN, strategy="zero3")).gpu
    churn = g.activations + g.logits_loss + g.comm_buffers + g.optimizer_temporaries
    assert g.allocator_slack == int(ALLOCATOR_SLACK * churn)
    assert g.allocator_slack < ALLOCATOR_SLACK * (g.parameters + g.optimizer_states + g.master_weights)
