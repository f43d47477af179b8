"""The planner on the models people fine-tune now (issue #63): the presets' verdicts on the example profiles,
and the case that motivated it — Qwen3-30B-A3B on 8 A100s, once planned as "2.89B params" and "fits at 36.6
GiB without checkpointing" while its parameters, gradients and AdamW state alone need ~57 GiB a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.shape import ModelShape
from launcher.commands.plan_cmd import plan_launch
from launcher.plan.activations import activation_terms
from launcher.plan.memory import GIB
from launcher.plan.planner import PlanInput, memory_options
from launcher.resolve.options import LaunchRequest, resolve
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli

NEW_PRESETS = ("llama3.1-8b", "llama3.3-70b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
               "gpt-oss-20b", "gpt-oss-120b", "gemma3-27b")
# Full fine-tuning on one 8-GPU A100 node: AdamW's 16 B a parameter over 8 GPUs is 2 B a parameter a GPU, so
# up to ~32B fits with the settings autofit picks; 70B, 117B and 235B need more nodes (the plan says how many).
NEEDS_MORE_NODES = {"llama3.3-70b": 2, "gpt-oss-120b": 4, "qwen3-235b-a22b": 8}


def _plan(model: str, profile: str = "a100", **kw: object):
    request = LaunchRequest(model=model, cluster=str(EXAMPLE_CLUSTER), profile=profile, output="/shared/runs/x",
                            **kw)  # type: ignore[arg-type]
    return plan_launch(resolve(request)).plan


def test_qwen3_30b_a3b_without_checkpointing_does_not_fit_8_a100s() -> None:
    plan = _plan("qwen3-30b-a3b", context_parallel=1,
                 train_flags={"gradient_checkpointing": False, "per_device_train_batch_size": 1})
    assert plan.params_total == 30_532_122_624  # every expert: 48 layers x 128 x 3 x 2048 x 768 of it
    assert plan.fits is False and plan.gpu.total > plan.gpu_usable_bytes
    assert (plan.gpu.parameters + plan.gpu.optimizer_states) / GIB > 42  # fp32 weights + AdamW m, v, /8
    assert any("checkpointing" in s.text for s in plan.suggestions)


def test_qwen3_30b_a3b_default_plan_fits_with_the_settings_it_needs(roomy_tmp: Path) -> None:
    """Autofit finds the plan that fits (per-layer checkpointing), and the table says so and counts 30.53B."""
    result = run_cli(["plan", "--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100", "--model", "qwen3-30b-a3b",
                      "--output", str(roomy_tmp / "run")], roomy_tmp, env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "30.53B params (3.35B active)" in result.stdout and "checkpointing on" in result.stdout
    assert "Verdict fits" in result.stdout


@pytest.mark.parametrize("model", NEW_PRESETS)
def test_new_presets_get_a_sensible_verdict_on_an_a100_node(model: str) -> None:
    plan = _plan(model)
    nodes = NEEDS_MORE_NODES.get(model)
    if nodes is None:
        assert plan.fits is True, model
        assert plan.gpu.total <= plan.gpu_usable_bytes
    else:
        assert plan.fits is False, model
        assert any(s.change.get("nodes") == nodes for s in plan.suggestions), plan.suggestions
    assert _plan(model, lora=True).fits is True  # LoRA on one node fits every one of them


def test_moe_state_counts_every_expert_sharded() -> None:
    """Parameters, gradients and AdamW moments of all 30.5B parameters, fp32, over 8 GPUs: ~57 GiB a GPU."""
    plan = _plan("qwen3-30b-a3b")
    per_gpu = 16 * plan.params_total / 8 / GIB
    assert per_gpu == pytest.approx(56.9, abs=0.1)
    assert plan.params_trainable == plan.params_total


# A tiny Qwen3-MoE and its dense twin (same attention, a SwiGLU MLP of width k·I_expert): the planned activations
# differ by exactly the grouped-expert block's routing tensors (tests/train/test_moe_saved_activations.py
# measures them on CPU), the router logits each layer returns for the load-balancing loss, and the fp32 combine.
TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 8,
            "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "vocab_size": 128, "intermediate_size": 96}
DENSE_TWIN = {**{k: v for k, v in TINY_MOE.items() if "expert" not in k}, "model_type": "qwen3",
              "intermediate_size": 2 * 32}


@pytest.mark.parametrize("checkpointing", [True, False])
def test_moe_activations_grow_by_the_routing_tensors_the_block_saves(checkpointing: bool) -> None:
    tokens, elem, d, experts, k, layers = 4096, 2, 64, 8, 2, 2
    terms = {}
    for name, arch in (("moe", TINY_MOE), ("dense", DENSE_TWIN)):
        inp = PlanInput(arch=arch, gpus_per_node=1, gpu_type="h100", micro_batch_tokens=tokens,
                        gradient_checkpointing=checkpointing)
        terms[name] = activation_terms(ModelShape.from_arch(arch), memory_options(inp), elem)
    moe, dense = terms["moe"], terms["dense"]
    # sorted input rows + expert outputs (k elem d each), the fp32 router's input copy in place of the bf16 MLP
    # input, its probabilities (4 E), top-k values/ids/sum, the permutation and its // k, the sorted weights
    block = 2 * k * elem * d + (4 - elem) * d + 4 * experts + 32 * k + 4
    logits = 4 * experts * layers  # every layer's fp32 router logits, held for the load-balancing loss
    per_layer = tokens * block
    assert moe["saved"] - dense["saved"] == tokens * logits + (0 if checkpointing else layers * per_layer)
    assert moe["recompute"] - dense["recompute"] == (per_layer if checkpointing else 0)
    combine = tokens * 4 * (2 * k + 1) * d  # the combine's two fp32 [T·k, d] and its fp32 sum [T, d]
    assert moe["workspace"] - dense["workspace"] == combine
    assert moe["last_layer"] - dense["last_layer"] == per_layer + combine
