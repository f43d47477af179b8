"""launcher/plan/speed.py's predicted speed behaves as the hardware does: more GPUs make more tokens/s, LoRA runs
faster than full fine-tuning, offload and recompute cost time (issue #55)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

from contract.protocol import EXIT_USAGE
from contract.shape import ModelShape
from launcher.plan import speed
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


def test_the_profiles_network_bandwidth_sets_the_time_of_inter_node_collectives_only():
    """profile.network_gbps (0 = the GPU type's typical 185 GB/s for A100 nodes with a NIC per GPU): a slower network
    slows a 2-node job, never a 1-node one; stating the typical figure changes nothing."""
    inp = PlanInput(arch=dict(PRESETS["llama-70b"].arch), gpus_per_node=8, gpu_type="a100", micro_batch_tokens=2048)
    rate = {(nodes, gbps): make_plan(dataclasses.replace(inp, nodes=nodes, network_gbps=gbps)).time.tokens_per_s
            for nodes in (1, 2) for gbps in (0.0, 185.0, 25.0)}
    assert rate[2, 185.0] == rate[2, 0.0] and rate[1, 25.0] == rate[1, 0.0]
    assert rate[2, 25.0] < 0.8 * rate[2, 0.0]


def test_network_gbps_from_the_profile_reaches_the_plan_and_a_negative_one_is_refused(tmp_path):
    example = (Path(__file__).resolve().parents[2] / "cluster.example.toml").read_text()

    def plan_with(line: str) -> subprocess.CompletedProcess[str]:
        cluster = tmp_path / "cluster.toml"
        cluster.write_text(example.replace("network_gbps = 0 ", line, 1))
        return subprocess.run([sys.executable, "-m", "launcher.cli", "plan", "--cluster", str(cluster), "--nodes", "2",
                               "--model", "llama-70b", "--json"], capture_output=True, text=True, timeout=120)

    typical, slow, refused = plan_with("network_gbps = 0 "), plan_with("network_gbps = 25 "), plan_with(
        "network_gbps = -1 ")
    # 3: the plan's verdict (the example's disk does not hold a 70B run's checkpoints here), not a refusal.
    assert typical.stdout and slow.stdout and EXIT_USAGE not in (typical.returncode, slow.returncode), slow.stderr
    assert json.loads(slow.stdout)["input"]["network_gbps"] == 25.0
    assert json.loads(slow.stdout)["time"]["tokens_per_s"] < json.loads(typical.stdout)["time"]["tokens_per_s"]
    assert refused.returncode == EXIT_USAGE and "network_gbps" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr




def test_checkpointing_recomputes_the_layers_not_the_lm_head():
    """Per-layer checkpointing runs the decoder layers' forward again, never the lm_head's: the share run again
    is a third of a full fine-tune's FLOPs less the head's forward, most visible on a model cut to 5 of the 8B's
    layers (its 128k-vocab head is a third of its FLOPs; bench/multi/gpu_save_async.py trains such a cut)."""
    def shares(layers: int) -> tuple[float, float]:
        inp = PlanInput(arch=dict(PRESETS["llama3-8b"].arch, num_hidden_layers=layers), gpus_per_node=1,
                        gpu_type="h100", micro_batch_tokens=8192)
        shape = ModelShape.from_arch(inp.arch)
        per_token = speed.flops_per_token(shape, inp)
        return speed.forward_share(shape, inp, per_token), 2 * shape.vocab * shape.hidden / per_token

    (cut, cut_head), (whole, whole_head) = shares(5), shares(32)
    assert abs(cut - (1 / 3 - cut_head)) < 1e-9 and abs(whole - (1 / 3 - whole_head)) < 1e-9
    assert cut < whole < 1 / 3
