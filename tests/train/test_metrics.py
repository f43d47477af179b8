"""MFU arithmetic against a hand-computed case, and the metrics.jsonl record shape."""

import time

import pytest

from contract.shape import ModelShape
from train.observe.metrics import attended_length, console_line, flops_per_token, step_record
from train.observe.startup import PHASES, StartupClock, job_start_epoch, process_start_epoch

ARCH = {  # d=64, L=2, 4 heads of 16, 2 KV heads, MLP 128, vocab 512, untied
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": False,
}


def test_matmul_params_by_hand():
    # per layer: q 64*64 + o 64*64 + k 64*32 + v 64*32 = 12288; MLP 3*64*128 = 24576
    # 2 layers = 73728; lm_head 64*512 = 32768 (counted, embedding lookup is not)
    assert ModelShape.from_arch(ARCH).matmul_params == 106_496
    # a tied lm_head is still a matmul
    assert ModelShape.from_arch({**ARCH, "tie_word_embeddings": True}).matmul_params == 106_496


def test_explicit_head_dim_sets_attention_width():
    # 4 heads of 32 (q width 128 != hidden 64), 2 KV heads of 32: q, o 64*128 each, k, v 64*64 each
    arch = {**ARCH, "head_dim": 32}
    assert ModelShape.from_arch(arch).matmul_params == 2 * (2 * 64 * 128 + 2 * 64 * 64 + 24_576) + 32_768
    # the attention term uses heads x head_dim = 128: 6*2*128*250
    assert flops_per_token(arch, 250.0) == 6 * ModelShape.from_arch(arch).matmul_params + 384_000


@pytest.mark.parametrize("extra", [{}, {"head_dim": 32}, {"tie_word_embeddings": True}])
def test_shape_counts_match_a_real_model(extra):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    arch = {**ARCH, **extra}
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**arch))
    real = sum(p.numel() for p in model.parameters())  # a tied lm_head is one parameter
    assert ModelShape.from_arch(arch).total_params == real
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert ModelShape.from_arch(arch).matmul_params == linears


def test_train_and_planner_count_the_same_flops():
    from launcher.plan.planner import PlanInput
    from launcher.plan.speed import flops_per_token as planned

    inp = PlanInput(arch=ARCH, mean_doc_tokens=250, micro_batch_tokens=4096)
    assert planned(ModelShape.from_arch(ARCH), inp) == flops_per_token(ARCH, 250.0)


def test_lora_counts_the_frozen_base_at_4n_and_the_adapters_at_6n_in_train_and_planner():
    import torch
    from launcher.plan.planner import PlanInput
    from launcher.plan.speed import flops_per_token as planned
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from contract.config import TrainConfig
    from train.observe.metrics import lora_params

    shape = ModelShape.from_arch(ARCH)
    cfg = TrainConfig()
    cfg.lora.enabled, cfg.lora.r = True, 8
    adapters = lora_params(ARCH, cfg)
    with torch.device("meta"):  # the adapters PEFT really adds, counted independently of our formula
        peft_model = get_peft_model(LlamaForCausalLM(LlamaConfig(**ARCH)),
                                    LoraConfig(r=8, target_modules=cfg.lora.target_modules))
    assert adapters == sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    expected = 4 * shape.matmul_params + 6 * adapters + 6 * 2 * 64 * 250.0
    assert flops_per_token(ARCH, 250.0, adapters) == expected < flops_per_token(ARCH, 250.0)
    inp = PlanInput(arch=ARCH, mean_doc_tokens=250, micro_batch_tokens=4096, lora=True, lora_r=8,
                    lora_target_modules=list(cfg.lora.target_modules))
    assert planned(shape, inp) == expected
    cfg.lora.enabled = False
    assert lora_params(ARCH, cfg) is None


def test_attended_length_is_token_weighted():
    assert attended_length([100, 300]) == 250.0  # (100² + 300²) / 400
    assert attended_length([]) == 0.0


def test_mfu_hand_computed():
    # 6N = 638976; 6·L·d·s̄ = 6*2*64*250 = 192000 -> 830976 FLOP/token
    assert flops_per_token(ARCH, 250.0) == 830_976.0
    # the step held 10 documents of 100 tokens and 10 of 300: 4000 tokens, s̄ = 250
    record = step_record(step=10, epoch=0, loss=1.5, lr=1e-4, grad_norm=0.5, tokens=4000,
                         doc_len_sq=10 * (100**2 + 300**2), seconds=2.0, world_size=2, arch=ARCH,
                         peak_flops=1e9, packing_efficiency=0.9, elapsed_s=20.0)
    assert record["tokens_per_s"] == 2000.0
    assert record["tokens_per_s_per_gpu"] == 1000.0
    assert record["tflops_per_gpu"] == pytest.approx(830_976_000 / 1e12)
    assert record["mfu"] == pytest.approx(0.830976)
    assert "MFU 83.1%" in console_line(record, 100)


def test_unknown_gpu_gives_null_mfu():
    record = step_record(step=1, epoch=0, loss=1.0, lr=1e-4, grad_norm=1.0, tokens=10, doc_len_sq=100,
                         seconds=1.0, world_size=1, arch=ARCH, peak_flops=None, packing_efficiency=1.0,
                         elapsed_s=1.0)
    assert record["mfu"] is None
    assert "MFU n/a" in console_line(record, 10)
    keys = {"step", "epoch", "loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_per_gpu",
            "tflops_per_gpu", "mfu", "peak_mem_gib", "packing_efficiency", "elapsed_s", "restart"}
    assert keys <= set(record)


def test_every_record_carries_total_steps_for_status(tmp_path):
    """`sft-launch status` reads the total from metrics.jsonl (launcher/ops/rundir.total_steps), not from log text."""
    import json

    from contract.config import TrainConfig
    from launcher.ops import rundir
    from train.observe.metrics import MetricsSink

    cfg = TrainConfig()
    cfg.run.dir = str(tmp_path)
    sink = MetricsSink(cfg, total_steps=40, start_step=0, enabled=True)
    sink.write({"step": 5, "epoch": 0, "eval_loss": 1.5})
    sink.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [{"step": 5, "epoch": 0, "eval_loss": 1.5, "total_steps": 40}]
    assert rundir.total_steps({"train": {"num_train_epochs": 2.0}}, records) == 40


def test_fp8_mfu_line_names_both_peaks():
    from contract.gpus import lookup
    from train.observe.metrics import mfu_peaks_line

    assert mfu_peaks_line(lookup("h100")) == ("MFU is counted against the bf16 peak (989 TFLOP/s per h100); "
                                             "FP8 peak 1,979 TFLOP/s")


def test_startup_clock_counts_from_the_job_start_then_the_process_start(monkeypatch):
    """The batch script's $EPOCHREALTIME may carry the locale's decimal comma; without it the clock starts
    at this process's start (before any import of ours), and every phase is in the record, in order."""
    assert job_start_epoch({"SFT_LAUNCH_JOB_START": "1700000000,25"}) == 1700000000.25
    assert job_start_epoch({"SFT_LAUNCH_JOB_START": "x"}) is job_start_epoch({}) is None
    started = process_start_epoch()
    assert started is not None and started <= time.time()
    monkeypatch.delenv("SFT_LAUNCH_JOB_START", raising=False)
    clock = StartupClock()
    clock.mark("imports")
    record = clock.record(step=1, resumed=False)
    assert (record["origin"], list(record["phases"]), record["phases"]["launch"]) == ("process", list(PHASES), 0.0)
    assert abs(sum(record["phases"].values()) - record["total_s"]) < 1e-9
    assert console_line(record, 10).startswith(f"startup (start): {record['total_s']:.1f} s from process start")
    with pytest.raises(ValueError):
        clock.mark("warm-up")
