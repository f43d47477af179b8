"""launcher/plan/speed.py's predicted speed behaves as the hardware does: more GPUs make more tokens/s, LoRA runs
faster than full fine-tuning, offload and recompute cost time (issue #55)."""

from __future__ import annotations

import dataclasses

from launcher.plan.planner import PlanInput, make_plan
from launcher.resolve.presets import PRESETS


def _rate(**change) -> float:
    inp = PlanInput(arch=dict(PRESETS["llama3-8b"].arch), gpus_per_node=8, gpu_type="h100", micro_batch_tokens=8192)
    return make_plan(dataclasses.replace(inp, **change)).time.tokens_per_s


def test_more_gpus_make_more_tokens_per_second():
    rates = [_rate(gpus_per_node=g) for g in (1, 2, 4, 8)] + [_rate(nodes=2)]
    assert rates == sorted(rates) and rates[-1] > 1.8 * rates[3]


def test_lora_is_faster_than_full_fine_tuning_and_checkpointing_costs_its_recompute():
    assert _rate(lora=True) > _rate()
    assert _rate(gradient_checkpointing=False) > _rate() > 0.7 * _rate(gradient_checkpointing=False)


def test_offload_is_slower():
    assert _rate(cpu_offload=True) < _rate()
    assert _rate(activation_offload=True) <= _rate()


def test_a_run_across_nodes_pays_for_slower_links_than_within_one():
    inp = PlanInput(arch=dict(PRESETS["llama-70b"].arch), gpus_per_node=8, gpu_type="a100", micro_batch_tokens=512)
    inside, across = make_plan(dataclasses.replace(inp, nodes=1)), make_plan(dataclasses.replace(inp, nodes=2))
    assert across.time.tokens_per_s / 2 < inside.time.tokens_per_s  # per node: less than one node alone
