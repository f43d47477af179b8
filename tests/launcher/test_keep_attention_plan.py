"""train.recompute_attention = false in the plan: each layer's checkpoint keeps the attention output and its
log-sum-exp on the GPU (activation_offload or not), and the step runs attention's forward once, not twice."""

from __future__ import annotations

import dataclasses

from contract.config import load_train_config
from contract.shape import ModelShape
from launcher.execute.render import render_files
from launcher.plan.activations import activation_terms
from launcher.plan.plan_format import format_plan
from launcher.plan.planner import PlanInput, make_plan, memory_options
from launcher.plan.speed import EFFICIENCY, compute_seconds
from launcher.resolve.options import LaunchRequest, resolve
from launcher.resolve.plan_input import plan_input_from_launch
from tests.launcher.test_planner import LLAMA3_8B

TOKENS = 131072
LONG = PlanInput(arch=LLAMA3_8B, gpus_per_node=1, gpu_type="h200", lora=True, micro_batch_tokens=TOKENS,
                 loss_chunk_tokens=4096, mean_doc_tokens=TOKENS, cpu_mem_per_node_gib=512)
# per layer: the bf16 output [T, 32 x 128] and the fp32 log-sum-exp [32, T]
KEPT_PER_LAYER = TOKENS * (2 * 4096 + 4 * 32)


def _terms(inp: PlanInput) -> dict[str, int]:
    return activation_terms(ModelShape.from_arch(inp.arch), memory_options(inp), 2)


def test_every_layer_keeps_its_attention_output_and_lse_on_the_gpu_with_or_without_offload():
    for offload in (False, True):
        recompute = dataclasses.replace(LONG, activation_offload=offload)
        keep = dataclasses.replace(recompute, recompute_attention=False)
        before, after = _terms(recompute), _terms(keep)
        assert after["saved"] - before["saved"] == 32 * KEPT_PER_LAYER
        assert before["recompute"] - after["recompute"] == KEPT_PER_LAYER  # the recomputed layer reads it back
        plans = make_plan(recompute), make_plan(keep)
        assert plans[1].gpu.activations - plans[0].gpu.activations == 31 * KEPT_PER_LAYER  # at backward/layers
        assert plans[1].cpu["offload"] == plans[0].cpu["offload"]
        assert "keeping attention outputs" in plans[1].gpu.notes["activations"]
    no_checkpointing = dataclasses.replace(LONG, gradient_checkpointing=False)
    assert _terms(dataclasses.replace(no_checkpointing, recompute_attention=False)) == _terms(no_checkpointing)


def test_the_step_runs_attention_forward_once():
    """Attention's FLOPs in a checkpointed step: forward, backward (2x) and the forward again, 4/3 of the
    6·L·a·s̄ counted; kept: 3/3. The step saves a third of the counted attention work's time."""
    shape = ModelShape.from_arch(LLAMA3_8B)
    keep = dataclasses.replace(LONG, recompute_attention=False)
    plans = make_plan(LONG), make_plan(keep)
    per_token = plans[0].time.flops_per_token
    saved = compute_seconds(shape, LONG, per_token, TOKENS, 1.0) - compute_seconds(shape, keep, per_token, TOKENS, 1.0)
    assert abs(saved - TOKENS * shape.attention_flops_per_token(TOKENS) / 3 / EFFICIENCY["h200"]) < 1e-9 * saved
    assert plans[1].time.tokens_per_s > plans[0].time.tokens_per_s
    assert "checkpointing on (attention outputs kept)" in format_plan(plans[1])
    assert "checkpointing on ·" in format_plan(plans[0])


def test_the_key_reaches_train_toml_and_the_plan(tmp_path):
    launch = resolve(LaunchRequest(model="tiny", executor="local", output=str(tmp_path / "r"),
                                   sets=["train.recompute_attention=false"]))
    (tmp_path / "train.toml").write_text(render_files(launch)["train.toml"])
    assert load_train_config(tmp_path / "train.toml").train.recompute_attention is False
    assert plan_input_from_launch(launch).recompute_attention is False
    default = resolve(LaunchRequest(model="tiny", executor="local", output=str(tmp_path / "d")))
    assert plan_input_from_launch(default).recompute_attention is True
