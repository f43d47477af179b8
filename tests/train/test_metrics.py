"""MFU arithmetic against a hand-computed case, and the metrics.jsonl record shape."""

import pytest

from train.metrics import attended_length, console_line, flops_per_token, matmul_params, step_record

ARCH = {  # d=64, L=2, 4 heads of 16, 2 KV heads, MLP 128, vocab 512, untied
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": False,
}


def test_matmul_params_by_hand():
    # per layer: q 64*64 + o 64*64 + k 64*32 + v 64*32 = 12288; MLP 3*64*128 = 24576
    # 2 layers = 73728; lm_head 64*512 = 32768 (counted, embedding lookup is not)
    assert matmul_params(ARCH) == 106_496
    # a tied lm_head is still a matmul
    assert matmul_params({**ARCH, "tie_word_embeddings": True}) == 106_496


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
