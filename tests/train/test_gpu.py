"""GPU paths: torch varlen attention on packed batches, the Liger fused loss, and a bf16 training
run with stop -> checkpoint -> resume (FSDP2 over 2 GPUs when there are 2). Skipped without CUDA:
CI has no GPU; these run on the GPU machine (see BENCHMARKS.md for the command)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.faults import STOP_AT_STEP_ENV
from tests.train.run_helpers import metrics, read_log, run_training, write_run
from train.attention import setup_attention
from train.checkpoint import MARKER
from train.packing import collate_packed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")

GPU_ARCH = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "tie_word_embeddings": False}


def test_varlen_packed_matches_per_document_forward():
    name = setup_attention("varlen", torch.device("cuda"), packed=True)
    torch.manual_seed(0)
    config = LlamaConfig(**GPU_ARCH)
    config._attn_implementation = name
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (37, 120, 5, 64)]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    inputs = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        packed = model(**inputs).logits[0].float()
        model.set_attn_implementation("sdpa")
        separate = torch.cat([model(input_ids=torch.tensor([d], device="cuda")).logits[0] for d in docs]).float()
    torch.testing.assert_close(packed, separate, rtol=3e-2, atol=3e-2)


def test_liger_fused_loss_matches_dense():
    pytest.importorskip("liger_kernel", reason="liger-kernel not installed")
    from train.loss import linear_cross_entropy_sum

    torch.manual_seed(0)
    hidden = torch.randn(1, 4096, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(32000, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 32000, (1, 4096), device="cuda")
    labels[0, ::5] = -100
    dense = linear_cross_entropy_sum(hidden.float(), weight.float(), labels, backend="dense")
    fused = linear_cross_entropy_sum(hidden, weight, labels, backend="liger")
    torch.testing.assert_close(fused.float(), dense, rtol=1e-2, atol=1e-2)


def test_bf16_training_stops_saves_and_resumes(tmp_path):
    gpus = 2 if torch.cuda.device_count() >= 2 else 1
    run = write_run(tmp_path / "run", {
        "model": {"arch": GPU_ARCH, "attn_implementation": "auto", "precision": "bf16"},
        "data": {"tokens_per_micro_batch": 2048},
        "train": {"max_steps": 16, "save_steps": 1000, "compile": True, "gradient_checkpointing": True},
    }, processes=gpus)
    yaml = run / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("mixed_precision: 'no'", "mixed_precision: 'bf16'"))
    first = run_training(run, {STOP_AT_STEP_ENV: "6"}, timeout=400)
    assert first != 0, read_log(run)
    assert (run / "checkpoints" / "step-00000006" / MARKER).exists(), read_log(run)
    assert run_training(run, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")
    log = read_log(run, "resume.log")
    assert "varlen" in log
    if gpus == 2:
        assert "FSDP" in log
    records = [r for r in metrics(run) if "loss" in r]
    assert records[-1]["step"] == 16 and records[-1]["peak_mem_gib"] > 0
    assert (run / "export" / "config.json").exists()
