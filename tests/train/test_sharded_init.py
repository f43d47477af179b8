"""model.init = "sharded" (train/engine/sharded_init.py): a meta model whose random weights each rank draws
for its own FSDP2 shards. The gathered initial state is the same bit for bit without FSDP (one process)
and under FSDP2 on 2 ranks (a tied embedding with an odd row count: uneven shards); a 2-rank LoRA run
trains, with the losses of a 1-rank run, and a full fine-tune starts from the same base weights; the
refused combinations are one line each."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.config import TrainConfig
from contract.schema import ConfigError, build
from tests.train.run_helpers import REPO, launch_env, metrics, read_log, run_training, write_run

WORKER = REPO / "tests" / "train" / "workers" / "sharded_init.py"
# vocab 515: the embedding's rows do not split evenly over 2 ranks; tied to lm_head.
ARCH = {"vocab_size": 515, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "tie_word_embeddings": True}
UPSTREAM_ABORT = "terminate called without an active exception"
SHARDED = {"model": {"init": "sharded", "arch": ARCH},
           "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0}}  # no dropout: 1 and 2 ranks draw no masks


def initial_state(run_dir: Path, processes: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The worker's gathered initial state and facts: `processes` = 0 is one process without FSDP."""
    from safetensors.torch import load_file

    write_run(run_dir, SHARDED, processes=max(processes, 1))
    launch = [] if processes == 0 else ["-m", "accelerate.commands.launch", "--config_file",
                                        str(run_dir / "accelerate.yaml")]
    for _ in range(2):
        proc = subprocess.run([sys.executable, *launch, str(WORKER), str(run_dir)], cwd=REPO, env=launch_env(),
                              capture_output=True, text=True, timeout=240)
        # Once more only for gloo's own abort (a C++ std::terminate in a rank, SIGABRT, no Python error: seen in
        # this test in CI on 2026-12-06, though the worker releases its group; train/engine/sharding.py
        # release_process_group says more); any other failure fails at once.
        if proc.returncode == 0 or UPSTREAM_ABORT not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return load_file(run_dir / "initial.safetensors"), json.loads((run_dir / "initial.json").read_text())


@pytest.mark.slow
def test_the_initial_weights_do_not_depend_on_the_world_size(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    alone, alone_facts = initial_state(tmp_path / "one", 0)
    sharded, sharded_facts = initial_state(tmp_path / "two", 2)
    assert alone_facts["distributed_type"] == "DistributedType.NO"
    assert sharded_facts["distributed_type"] == "DistributedType.FSDP" and sharded_facts["world"] == 2
    for facts in (alone_facts, sharded_facts):
        assert facts["optimizer_holds_the_trainable_parameters"] and facts["tied"] and not facts["meta_left"], facts
    assert alone.keys() == sharded.keys()
    assert [key for key in alone if not torch.equal(alone[key], sharded[key])] == []

    prefix = "base_model.model."
    embedding = alone[prefix + "model.embed_tokens.weight"]
    assert embedding.shape == (515, 64) and abs(embedding.std().item() - 0.02) < 0.002
    assert torch.equal(alone[prefix + "lm_head.weight"], embedding)
    layer = prefix + "model.layers.0."
    assert torch.equal(alone[layer + "input_layernorm.weight"], torch.ones(64))
    assert not alone[layer + "self_attn.q_proj.lora_B.default.weight"].any()
    lora_a = alone[layer + "mlp.down_proj.lora_A.default.weight"]  # PEFT's bound: 1/sqrt(fan_in = 128)
    assert lora_a.abs().max() <= 1 / math.sqrt(128) and lora_a.std() > 0.5 / math.sqrt(3 * 128)
    assert not torch.equal(alone[layer + "self_attn.q_proj.base_layer.weight"],
                           alone[prefix + "model.layers.1.self_attn.q_proj.base_layer.weight"])
    reference = LlamaForCausalLM(LlamaConfig(**ARCH)).model.rotary_emb.inv_freq
    assert torch.equal(sharded[f"buffer:{prefix}model.rotary_emb.inv_freq"], reference)


@pytest.mark.slow
def test_a_sharded_init_lora_run_trains_on_two_ranks_as_on_one(tmp_path):
    """LoRA on 2 ranks and on 1 (twice the accumulation): the same losses. A full fine-tune on 2 ranks (two
    optimizer groups, weight decay) trains from the same base weights: LoRA B is zero, so its first loss
    is the LoRA runs' own."""
    train = {"max_steps": 6, "logging_steps": 1, "gradient_accumulation_steps": 1}
    two = write_run(tmp_path / "two", SHARDED | {"train": train})
    one = write_run(tmp_path / "one", SHARDED | {"train": {**train, "gradient_accumulation_steps": 2}}, processes=1)
    full = write_run(tmp_path / "full", {"model": SHARDED["model"], "train": {**train, "weight_decay": 0.1}})
    for run_dir in (two, one, full):
        assert run_training(run_dir) == 0, read_log(run_dir)[-4000:]
    assert "random init drawn per shard" in read_log(two) and "DistributedType.FSDP" in read_log(two)
    losses = {run: {r["step"]: r["loss"] for r in metrics(run) if "loss" in r} for run in (two, one, full)}
    for run in (two, full):
        records = [r for r in metrics(run) if "loss" in r]
        assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in records)
        assert records[-1]["loss"] < records[0]["loss"] - 0.05, [r["loss"] for r in records]
    assert abs(losses[two][1] - math.log(515)) < 0.05  # normal(0, 0.02) weights: near-uniform logits
    assert losses[one].keys() == losses[two].keys() and losses[one][1] == losses[two][1] == losses[full][1]
    assert max(abs(losses[one][s] - losses[two][s]) for s in losses[two]) < 1e-3, losses


@pytest.mark.parametrize(("data", "message"), [
    ({"model": {"init": "sharded", "path": "/models/llama"}}, "model.init: 'sharded' draws random weights"),
    ({"model": {"init": "sharded", "arch": ARCH}, "lora": {"enabled": True, "quant": "nf4"}},
     "model.init: 'sharded' is not for QLoRA"),
    ({"model": {"init": "per-shard", "arch": ARCH}}, "model.init: must be one of 'full', 'sharded'"),
])
def test_refused_combinations_are_one_line(data, message):
    with pytest.raises(ConfigError) as err:
        build(TrainConfig, data)
    assert message in str(err.value) and "\n" not in str(err.value)
