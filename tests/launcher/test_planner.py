"""Planner: hand-computed memory terms, monotonicity, verdicts/suggestions, time, signal lead, JSON."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.plan.activations import layer_activation_bytes_per_token
from launcher.plan.memory import ALLOCATOR_SLACK, GIB, state_bytes
from contract.shape import ModelShape
from launcher.plan.plan_format import format_plan
from launcher.plan.planner import (
    PlanInput, make_plan, memory_options, plan_input_from_dict, plan_to_dict,
)
from contract.schema import ConfigError

LLAMA2_7B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32,
                 intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False)
LLAMA3_8B = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                 intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
LLAMA32_1B = dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True)
LLAMA3_70B = dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                  intermediate_size=28672, vocab_size=128256, tie_word_embeddings=False)


def plan(arch=LLAMA3_8B, **kw):
    return make_plan(PlanInput(arch=arch, **kw))


def state(p) -> int:
    """Persistent per-GPU model state (the ZeRO accounting), whatever the peak phase holds."""
    shape = ModelShape.from_arch(p.input.arch)
    return sum(value for value, _ in state_bytes(shape, memory_options(p.input)).values())


def test_parameter_counts_match_published_models():
    assert ModelShape.from_arch(LLAMA2_7B).total_params == 6_738_415_616
    assert ModelShape.from_arch(LLAMA3_8B).total_params == 8_030_261_248
    assert ModelShape.from_arch(LLAMA32_1B).total_params == 1_235_814_400


@pytest.mark.parametrize("strategy", ["zero3", "fsdp", "fsdp1"])
def test_7b_full_shard_on_8_gpus_is_16n_over_p(strategy):
    n = ModelShape.from_arch(LLAMA2_7B).total_params
    p = plan(LLAMA2_7B, strategy=strategy, nodes=1, gpus_per_node=8, gpu_type="a100")
    assert abs(state(p) - 16 * n / 8) <= 8  # only the ceil of each shard
    assert p.gpu.total < p.gpu_usable_bytes and p.fits


def test_zero3_terms_split_as_in_the_zero_paper():
    n = ModelShape.from_arch(LLAMA2_7B).total_params
    g = plan(LLAMA2_7B, strategy="zero3", gpus_per_node=8).gpu
    assert (g.parameters, g.gradients, g.master_weights, g.optimizer_states) == (
        pytest.approx(2 * n / 8, abs=1), pytest.approx(2 * n / 8, abs=1),
        pytest.approx(4 * n / 8, abs=1), pytest.approx(8 * n / 8, abs=1))


def test_zero2_keeps_full_bf16_params():
    n = ModelShape.from_arch(LLAMA2_7B).total_params
    g = plan(LLAMA2_7B, strategy="zero2", gpus_per_node=8).gpu
    assert g.parameters == 2 * n
    assert g.optimizer_states == pytest.approx(8 * n / 8, abs=1)


def test_llama3_8b_activation_per_token_per_layer_by_hand():
    # 2 norms x (4+2)d + (2d + 2(d+2kv) + 2d + 4H + 2d) + (2d + 8I), d=4096, kv=1024, I=14336, H=32
    expected = 12 * 4096 + (2 * 4096 + 2 * (4096 + 2 * 1024) + 2 * 4096 + 4 * 32 + 2 * 4096) + (2 * 4096 + 8 * 14336)
    assert layer_activation_bytes_per_token(ModelShape.from_arch(LLAMA3_8B), 2) == expected == 209_024


def test_checkpointing_keeps_one_hidden_state_per_layer():
    on = plan(gpus_per_node=8, gradient_checkpointing=True, micro_batch_tokens=4096)
    off = plan(gpus_per_node=8, gradient_checkpointing=False, micro_batch_tokens=4096)
    assert off.gpu.activations > 8 * on.gpu.activations
    assert on.gpu.activations >= 32 * 2 * 4096 * 4096  # L x 2 bytes x d x tokens


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp1", "zero3"])
def test_more_nodes_means_less_memory_per_gpu_under_full_shard(strategy):
    totals = [plan(LLAMA3_70B, strategy=strategy, nodes=n, gpus_per_node=8).gpu.total for n in (1, 2, 4, 8)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def test_hybrid_shard_state_does_not_shrink_with_nodes():
    assert state(plan(strategy="hsdp", nodes=2)) == state(plan(strategy="hsdp", nodes=8))


def test_70b_on_one_gpu_does_not_fit_and_each_suggestion_fits():
    p = plan(LLAMA3_70B, nodes=1, gpus_per_node=1, gpu_type="h100")
    assert p.fits is False and p.verdict.startswith("does not fit: GPU memory")
    assert p.suggestions, "expected at least one way to fit"
    for s in p.suggestions:
        fixed = make_plan(dataclasses.replace(p.input, **s.change))
        assert fixed.fits, s.text
    assert "DOES NOT FIT" in format_plan(p)


def test_smallest_node_count_is_minimal():
    p = plan(LLAMA3_70B, nodes=1, gpus_per_node=8, micro_batch_tokens=8192)
    nodes = next(s.change["nodes"] for s in p.suggestions if "nodes" in s.change)
    assert plan(LLAMA3_70B, nodes=nodes, gpus_per_node=8).fits
    assert not plan(LLAMA3_70B, nodes=nodes - 1, gpus_per_node=8).fits


def test_checkpointing_is_suggested_when_it_alone_fits():
    p = plan(gpus_per_node=8, gradient_checkpointing=False, micro_batch_tokens=16384)
    assert not p.fits
    assert {"gradient_checkpointing": True} in [s.change for s in p.suggestions]


def test_fitting_run_has_no_suggestions():
    p = plan(LLAMA32_1B, gpus_per_node=1, micro_batch_tokens=4096)
    assert p.fits is True and p.verdict == "fits" and p.suggestions == []


def test_cpu_offload_moves_state_to_host():
    n = ModelShape.from_arch(LLAMA3_8B).total_params
    p = plan(gpus_per_node=8, cpu_offload=True)
    # Only the bf16 gradients wait on the GPU for their copy to the host (measured, launcher/plan/memory.py).
    assert state(p) == pytest.approx(2 * n / 8, abs=8)
    assert p.gpu.parameters == p.gpu.optimizer_states == p.gpu.master_weights == 0
    assert p.cpu["offload"] == pytest.approx(8 * 16 * n / 8, abs=8)


def test_cpu_ram_per_node_is_checked():
    p = plan(LLAMA3_70B, nodes=8, gpus_per_node=8, cpu_mem_per_node_gib=64)
    assert p.fits_gpu and p.fits_cpu is False and p.verdict == "does not fit: CPU RAM per node"


def test_host_ram_for_loading_follows_the_weights_source():
    """FSDP: a checkpoint is read by rank 0 only; a random init draws the whole model on every rank's CPU;
    model.init = sharded draws shards on the GPUs and loads nothing on the host."""
    full = 4 * ModelShape.from_arch(LLAMA3_8B).total_params
    loading = {source: plan(gpus_per_node=4, model_source=source).cpu["model_loading"]
               for source in ("checkpoint", "random", "sharded")}
    assert loading == {"checkpoint": full, "random": 4 * full, "sharded": 0}


def test_lora_trains_adapters_only():
    shape = ModelShape.from_arch(LLAMA3_8B)
    assert shape.lora_params(8, ["q_proj", "v_proj"]) == 32 * 8 * ((4096 + 4096) + (4096 + 1024))
    full, lora = plan(gpus_per_node=1), plan(gpus_per_node=1, lora=True)
    assert lora.gpu.parameters == pytest.approx(2 * shape.total_params, rel=0.02)
    assert lora.gpu.optimizer_states < full.gpu.optimizer_states / 100 and lora.fits and not full.fits


def test_time_and_requeues_from_max_steps_and_time_limit():
    p = plan(gpus_per_node=8, max_steps=5000, time_limit_s=3600, micro_batch_tokens=8192)
    t = p.time
    assert t.total_tokens == 5000 * t.tokens_per_step
    assert t.train_time_s == pytest.approx(t.total_tokens / t.tokens_per_s)
    usable = 3600 - p.input.startup_s - p.signal_lead_s
    assert t.job_segments == -(-t.train_time_s // usable) and t.requeues == t.job_segments - 1 >= 1
    assert t.gpu_hours == pytest.approx(t.eta_s * 8 / 3600)


def test_steps_from_dataset_tokens():
    t = plan(gpus_per_node=8, dataset_tokens=10**9, num_train_epochs=2).time
    assert t.steps == -(-2 * 10**9 // t.tokens_per_step)


def test_signal_lead_grows_with_checkpoint_size_and_slower_storage():
    leads = [plan(a, nodes=2).signal_lead_s for a in (LLAMA32_1B, LLAMA3_8B, LLAMA3_70B)]
    assert leads == sorted(leads) and leads[0] >= 60 and leads[2] > leads[0]
    assert plan(storage_write_gbps=0.5).signal_lead_s > plan(storage_write_gbps=5).signal_lead_s
    assert all(lead % 10 == 0 for lead in leads)


def test_json_round_trip():
    p = plan(gpus_per_node=8, dataset_tokens=10**8, time_limit_s=7200, lora=True, lora_target_modules=["q_proj"])
    data = plan_to_dict(p)
    assert json.loads(json.dumps(data)) == data
    again = make_plan(plan_input_from_dict(json.loads(json.dumps(data["input"]))))
    assert plan_to_dict(again) == data
    assert data["gpu"]["total"] == p.gpu.total and data["fits"] is True


def test_bad_input_names_the_key():
    with pytest.raises(ConfigError, match="micro_batch_tokenz"):
        plan_input_from_dict({"arch": LLAMA3_8B, "micro_batch_tokenz": 1})
    with pytest.raises(ConfigError, match="arch.hidden_size"):
        make_plan(PlanInput(arch={k: v for k, v in LLAMA3_8B.items() if k != "hidden_size"}))
    with pytest.raises(ConfigError, match="cpu_offload"):
        make_plan(PlanInput(arch=LLAMA3_8B, strategy="ddp", cpu_offload=True))
    with pytest.raises(ConfigError, match="lora_target_modules"):
        make_plan(PlanInput(arch=LLAMA3_8B, lora=True, lora_target_modules=["qproj"]))


def test_unknown_gpu_gives_unknown_verdict_and_warning():
    p = plan(gpu_type="mystery")
    assert p.fits is None and p.time.tokens_per_s is None and p.warnings
    assert plan(gpu_type="mystery", gpu_memory_gib=80).fits is True


def test_table_shows_every_term():
    text = format_plan(plan(gpus_per_node=8, dataset_tokens=10**9, time_limit_s=4 * 3600))
    for word in ("parameters", "gradients", "optimizer states", "master weights", "activations",
                 "logits loss", "comm buffers", "cuda context nccl", "total", "Verdict fits",
                 "GPU-hours", "requeue", "Signal"):
        assert word in text
    assert len(text.splitlines()) < 30 and GIB == 2**30


def test_gradients_exist_only_from_backward_on_unless_kept():
    # set_to_none frees them after each step: the logits-heavy pre-backward peak has none ...
    fresh = plan(LLAMA32_1B, gpus_per_node=1, micro_batch_tokens=8192).gpu
    assert fresh.peak_phase == "backward/lm_head" and fresh.gradients == 0
    # ... accumulation keeps them between micro-batches, DeepSpeed keeps its partitions allocated
    accumulating = plan(LLAMA32_1B, gpus_per_node=1, micro_batch_tokens=8192, gradient_accumulation_steps=2).gpu
    assert accumulating.gradients == 4 * ModelShape.from_arch(LLAMA32_1B).total_params
    assert plan(LLAMA32_1B, gpus_per_node=1, strategy="zero2").gpu.gradients > 0


def test_foreach_adamw_adds_one_fp32_temporary_per_param_at_the_step():
    n = ModelShape.from_arch(LLAMA3_8B).total_params
    kw = dict(gpus_per_node=8, micro_batch_tokens=1024, loss_chunk_tokens=1024)
    foreach, fused = plan(adamw_impl="foreach", **kw).gpu, plan(adamw_impl="fused", **kw).gpu
    assert foreach.peak_phase == "optimizer/step" and foreach.optimizer_temporaries == pytest.approx(4 * n / 8, abs=1)
    assert fused.optimizer_temporaries == 0 and fused.allocated < foreach.allocated


def test_reserved_and_total_sit_on_top_of_allocated():
    g = plan(LLAMA3_8B, gpus_per_node=4).gpu
    assert g.reserved >= g.allocated * (1 + ALLOCATOR_SLACK) - 1
    assert g.total == g.reserved + g.cuda_context_nccl and g.cuda_context_nccl >= GIB  # context + NCCL
    # torch optimizers: the moments and the forward/backward working set do not share cached segments
    assert g.reserved >= g.parameters + g.optimizer_states + g.activations + g.logits_loss


def test_preemption_loss_and_the_save_steps_that_bound_it():
    """GraceTime shorter than the stop-save: the job resumes from its newest COMPLETE checkpoint. With
    asynchronous saves that is up to save_steps + one write's worth of steps old; synchronous, save_steps."""
    from launcher.plan.saves import LOSS_TARGET_S, checkpoint_write_seconds

    p = plan(LLAMA3_70B, nodes=4, max_steps=2000, time_limit_s=4 * 3600, save_steps=500, async_save=True)
    c, step_s = p.cadence, p.time.step_time_s
    assert c.asynchronous and c.stop_save_s == p.signal_lead_s
    assert c.write_s == pytest.approx(checkpoint_write_seconds(p.checkpoint_bytes, p.input)) and c.write_s > 300
    assert c.lost_steps == 500 + -(-c.write_s // step_s) and c.lost_s == pytest.approx(c.lost_steps * step_s)
    assert c.suggested_save_steps == -(-max(LOSS_TARGET_S, c.write_s) // step_s) < 500
    text = format_plan(p)
    assert f"Preempt GraceTime under ~{p.signal_lead_s} s: a preempted job loses up to {c.lost_steps:,} steps" in text
    assert f"--set train.save_steps={c.suggested_save_steps} bounds it to" in text
    assert "finishing the asynchronous one in flight" in text

    sync = plan(LLAMA3_70B, nodes=4, max_steps=2000, save_steps=500, async_save=False).cadence
    assert not sync.asynchronous and sync.lost_steps == 500
    assert sync.suggested_save_steps * step_s >= sync.write_s / 0.05  # its pauses stay under 5% of the time
    deepspeed = plan(LLAMA3_8B, strategy="zero3", max_steps=100, async_save=True).cadence
    assert not deepspeed.asynchronous  # only FSDP2's sharded state is saved behind training
    # No step time (CPU): a synchronous run loses up to the interval; an asynchronous one, an unknown number more.
    assert plan(device="cpu", gpus_per_node=2, async_save=False).cadence.lost_steps == 500
    assert plan(device="cpu", gpus_per_node=2, async_save=True).cadence.lost_steps is None


def test_saves_are_asynchronous_by_default_where_the_run_can_stage_them():
    """train.async_save's default (TrainSection's, the planner's too): FSDP2 runs (CPU ones included, planned as
    "ddp") save asynchronously; DeepSpeed and FSDP1 synchronously; so do states the staging cannot copy (QLoRA's
    NF4, the float8 all-gather's wrapper) and runs with no periodic save before their last step, and the plan
    says why, as the run's log does."""
    from contract.config import TrainSection

    assert PlanInput(arch=LLAMA3_8B).async_save is TrainSection().async_save is True
    run = dict(nodes=4, max_steps=2000, save_steps=500)
    assert plan(LLAMA3_70B, **run).cadence.asynchronous
    assert plan(LLAMA3_8B, lora=True, **run).cadence.asynchronous
    assert plan(device="cpu", gpus_per_node=2, strategy="ddp").cadence.asynchronous  # FSDP2 over gloo
    for strategy in ("zero3", "fsdp1"):
        cadence = plan(LLAMA3_70B, strategy=strategy, **run).cadence
        assert not cadence.asynchronous and cadence.staging == "" and cadence.lost_steps == 500, strategy
    qlora = plan(LLAMA3_70B, lora=True, quant="nf4", **run)
    assert not qlora.cadence.asynchronous and "synchronous saves" in format_plan(qlora)
    assert "each save is written synchronously: QLoRA's NF4 base weights" in format_plan(qlora)
    fp8 = plan(LLAMA3_8B, gpu_type="h100", precision="fp8", fp8="torchao", fp8_all_gather=True, **run).cadence
    assert not fp8.asynchronous and "fp8_all_gather" in fp8.staging
    assert plan(LLAMA3_70B, lora=True, quant="nf4", async_save=False, **run).cadence.staging == ""
    short = plan(LLAMA3_70B, **(run | {"max_steps": 500})).cadence  # no periodic save below the last step
    assert not short.asynchronous and "no periodic save before the last step (500)" in short.staging


def test_the_plan_says_where_asynchronous_saves_are_staged_and_why():
    """train.async_save_staging = auto: CPU memory when a node's shards (the state / nodes) fit STAGING_RAM_SHARE of
    the RAM (profile.mem) its training processes leave, else node-local disk; unknown RAM: the run decides."""
    def staging(mem_gib, setting="auto", strategy="fsdp"):
        p = plan(LLAMA3_70B, nodes=4, max_steps=2000, save_steps=500, async_save=True, cpu_mem_per_node_gib=mem_gib,
                 async_save_staging=setting, strategy=strategy)
        return p.cadence.staging, format_plan(p), p.checkpoint_bytes

    big, text, state_bytes = staging(2000)
    assert big.startswith("staged in CPU memory: ") and "fit mem 2,000 GiB" in big and f"each save {big}" in text
    assert f"{state_bytes / 4 / 1e9:,.1f} GB of shards a node" in big
    small, _, _ = staging(240)  # 207 GB of shards a node: more than 80% of what the processes leave
    assert small.startswith("staged on node-local disk (profile.node_local_dir): ") and "exceed mem 240 GiB" in small
    assert "else on node-local disk" in staging(None)[0]
    assert staging(2000, "disk")[0].startswith("staged on node-local disk (profile.node_local_dir): train.async_")
    assert f"{state_bytes / 1e9:,.1f} GB of shards a node" in staging(None, strategy="hsdp")[0]  # a copy a node
    assert plan(LLAMA3_70B, nodes=4, max_steps=2000, async_save=False, cpu_mem_per_node_gib=240).cadence.staging == ""


def test_a_lora_run_that_leaves_every_expert_frozen_says_so():
    from launcher.plan.planner import frozen_experts

    moe = dict(LLAMA3_8B, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)
    attention_only = PlanInput(arch=moe, lora=True, lora_target_modules=["q_proj", "v_proj"])
    assert frozen_experts(attention_only) == ("LoRA leaves the 128 routed experts of every layer frozen: "
                                              "lora.target_modules names neither experts.gate_up_proj nor "
                                              "experts.down_proj")
    assert frozen_experts(PlanInput(arch=moe, lora=True, lora_target_modules=["q_proj", "experts.down_proj"])) is None
    assert frozen_experts(PlanInput(arch=LLAMA3_8B, lora=True)) is None  # dense: nothing to say
    assert frozen_experts(PlanInput(arch=moe)) is None  # full fine-tuning trains the experts
    assert "frozen" in " ".join(plan(arch=dict(LLAMA3_8B, num_local_experts=32), lora=True).warnings)
