"""The strategies table is the one list of names: the profile, the CLI, the planner and the templates use it."""

from __future__ import annotations

import typing

from contract.gpus import mixed_precision
from contract.strategies import CPU_STRATEGIES, LAUNCHABLE, STRATEGIES, PlannerStrategy, Strategy
from launcher.commands.launch_args import build_parser
from launcher.resolve.profile import ClusterProfile


def test_literals_and_cli_choices_come_from_the_table() -> None:
    assert typing.get_args(Strategy) == LAUNCHABLE == ("fsdp", "fsdp1", "zero2", "zero3")
    assert typing.get_args(PlannerStrategy) == tuple(STRATEGIES)
    assert typing.get_type_hints(ClusterProfile)["strategy"] == Strategy
    (action,) = [a for a in build_parser()._actions if a.dest == "strategy"]
    assert tuple(action.choices) == LAUNCHABLE


def test_what_each_strategy_implies() -> None:
    assert STRATEGIES["zero3"].config_files == ("accelerate.yaml", "deepspeed.json") and STRATEGIES["zero3"].gpu_only
    assert STRATEGIES["fsdp"].config_files == ("accelerate.yaml",) and STRATEGIES["fsdp"].fsdp_version == 2
    assert STRATEGIES["fsdp1"].fp32_params and STRATEGIES["ddp"].fp32_params and not STRATEGIES["fsdp"].fp32_params
    assert [name for name, spec in STRATEGIES.items() if not spec.sharded] == ["ddp"]
    assert CPU_STRATEGIES == ("fsdp",)


def test_one_mixed_precision_rule() -> None:
    assert mixed_precision("auto", on_gpu=False, has_bf16=None) == "no"
    assert mixed_precision("bf16", on_gpu=False, has_bf16=None) == "no"
    assert mixed_precision("auto", on_gpu=True, has_bf16=True) == "bf16"
    assert mixed_precision("auto", on_gpu=True, has_bf16=None) == "bf16"  # unknown GPU
    assert mixed_precision("auto", on_gpu=True, has_bf16=False) == "fp16"  # V100
    assert mixed_precision("fp32", on_gpu=True, has_bf16=True) == "no"
