"""Expert parallelism in the launcher (--expert_parallel N, parallel.expert; train/moe/expert_parallel.py):
what cannot split is refused in one line (exit 2) before anything is written or queued; the planner counts
each GPU's experts (never gathered) and the all-to-all buffers and time, and ranks the EP degrees by speed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from contract.parallel import expert_blocker
from contract.shape import ModelShape
from launcher.plan.activations import expert_dispatch_bytes
from launcher.plan.memory import gathered_layer_bytes
from launcher.plan.plan_format import format_plan, suggestion_flags
from launcher.plan.planner import PlanInput, Suggestion, make_plan
from launcher.plan.speed import collective_seconds, memory_options, step_time
from launcher.resolve.presets import resolve_model
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli

QWEN3_MOE = resolve_model("qwen3-30b-a3b").arch  # 128 experts, top-8, 48 MoE layers


def _input(**change: object) -> PlanInput:
    return dataclasses.replace(PlanInput(arch=dict(QWEN3_MOE), gpus_per_node=8, gpu_type="h100",
                                         micro_batch_tokens=8192), **change)


@pytest.mark.parametrize(("args", "message"), [
    (["--expert_parallel", "3"], "--expert_parallel 3: 3 does not divide the model's 128 experts"),
    (["--expert_parallel", "16"], "--expert_parallel 16: 16 does not divide the 8 ranks"),
    (["--expert_parallel", "8", "--strategy", "fsdp1"], "--expert_parallel 8: needs --strategy fsdp"),
    (["--expert_parallel", "8", "--set", "profile.cpu_offload=true"], "--expert_parallel 8: not with profile.cpu_offload"),
    (["--expert_parallel", "8", "--lora", "--set", "lora.target_modules=[\"q_proj\",\"experts.down_proj\"]",
      "--set", "lora.dropout=0"],  # an adapter on expert weights takes no dropout (contract.config)
     "--expert_parallel 8: LoRA on the experts or the router is not supported"),
    (["--expert_parallel", "8", "--model", "gpt-oss-20b"], "--expert_parallel 8: gpt_oss models are not supported"),
])
def test_plan_refuses_what_cannot_split_in_one_line(roomy_tmp: Path, args: list[str], message: str) -> None:
    model = [] if "--model" in args else ["--model", "qwen3-30b-a3b"]
    result = run_cli(["plan", "--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100", *model, *args,
                      "--output", str(roomy_tmp / "run")], roomy_tmp,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (roomy_tmp / "run").exists()


def test_the_rule_names_each_reason() -> None:
    assert expert_blocker(1, 8, None) is None and expert_blocker(8, 8, 128) is None
    assert expert_blocker(2, 2, None) == "the model has no mixture-of-experts layers"
    with pytest.raises(Exception, match="expert_parallel: needs --strategy fsdp"):
        _input(expert_parallel=8, strategy="ddp").validate()


def test_each_gpu_gathers_the_layer_without_the_experts_and_buffers_the_exchange() -> None:
    shape = ModelShape.from_arch(QWEN3_MOE)
    whole, split = (gathered_layer_bytes(shape, memory_options(_input(expert_parallel=n)), 2) for n in (1, 8))
    expert = 3 * shape.hidden * shape.expert_intermediate
    assert whole - split == 2 * expert * (128 - 16)  # the layer's 112 experts of other GPUs are never gathered
    assert expert_dispatch_bytes(shape, memory_options(_input()), 2) == 0
    tokens_out = 8192 * 8 * shape.hidden * 2  # k = 8 bf16 copies of the micro-batch's tokens
    assert expert_dispatch_bytes(shape, memory_options(_input(expert_parallel=8)), 2) == 3 * tokens_out


def test_speed_trades_the_experts_collectives_for_the_all_to_alls() -> None:
    shape = ModelShape.from_arch(QWEN3_MOE)
    plain, split, half = _input(), _input(expert_parallel=8), _input(expert_parallel=4)
    assert collective_seconds(shape, split, shape.total_params) < collective_seconds(shape, plain, shape.total_params) / 10
    per_token = 6.0 * shape.active_params
    assert step_time(split, per_token).other_s > step_time(plain, per_token).other_s  # the all-to-alls
    assert step_time(half, per_token).other_s > step_time(split, per_token).other_s  # + gathers from 2 replicas


def test_the_plan_ranks_the_degrees_and_suggests_the_flag() -> None:
    plan = make_plan(_input())
    options = {o.expert_parallel: o for o in plan.experts}
    assert set(options) == {1, 2, 4, 8} and options[8].experts_per_gpu == 16 and options[2].experts_per_gpu == 64
    ranked = [(not o.fits, -(o.tokens_per_s or 0)) for o in plan.experts]
    assert ranked == sorted(ranked)
    assert "Experts EP " in format_plan(plan)
    assert suggestion_flags(Suggestion({"expert_parallel": 8}, 1.0, "")) == "--expert_parallel 8"
    assert make_plan(_input(arch=dict(resolve_model("llama3.1-8b").arch))).experts == []  # a dense model: none


def test_when_only_expert_parallelism_fits_it_is_suggested() -> None:
    """Qwen3-235B-A22B on 8 nodes of 8: each layer's 128 experts (2.4B weights) are never gathered with EP 64."""
    big = dict(arch=dict(resolve_model("qwen3-235b-a22b").arch), nodes=8, micro_batch_tokens=4096)
    whole, split = (make_plan(_input(**big, expert_parallel=n, gpu_memory_gib=1000)).gpu.total for n in (1, 64))
    assert whole - split > 4 * 2**30
    plan = make_plan(_input(**big, gpu_memory_gib=(whole + split) / 2 / 2**30 / 0.95))
    assert plan.fits is False
    assert any(s.change == {"expert_parallel": 64} for s in plan.suggestions), plan.suggestions
    assert plan.experts[0].expert_parallel == 64 and plan.experts[0].fits  # ranked first: the one that fits
