"""The fused SwiGLU MLP's wiring on CPU: the custom ops are opaque to tracing with the right shapes,
only stock Llama MLPs are swapped, and train.fused_mlp = auto / true behave as documented where the
kernels cannot run. The kernels themselves are checked against the stock MLP in test_gpu."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch
from transformers import LlamaForCausalLM

from bench.kernels.gpu_gemm_tune import PIN_MIN_GAIN
from contract.config import TrainConfig
from contract.schema import ConfigError
from train.kernels import swiglu
from train.engine.model import apply_fused_mlp


def test_ops_are_opaque_to_tracing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w_gate_up, w_down = torch.empty(10, 64), torch.empty(2 * 96, 64), torch.empty(64, 96)
        out, preact = swiglu.swiglu_mlp_fwd(x, w_gate_up, w_down)
        assert out.shape == (10, 64) and preact.shape == (10, 2 * 96)
        grads = swiglu.swiglu_mlp_bwd(torch.empty(10, 64), x, w_gate_up, w_down, preact)
        assert [g.shape for g in grads] == [x.shape, w_gate_up.shape, w_down.shape]


def test_pinned_gemm_configs_file_is_well_formed():
    """train/assets/gemm_configs.json (written by bench/kernels/gpu_gemm_tune.py): every key names a GPU, one of
    the two epilogue GEMMs and its N, K, and every config has the fields quack's GemmConfig takes."""
    entries = json.loads(swiglu.GEMM_CONFIGS.read_text())["configs"]
    for key, entry in entries.items():
        assert re.fullmatch(r"sm\d+ (gated|dgated) n=\d+ k=\d+", key), key
        assert {"tile_m", "tile_n", "cluster_m", "cluster_n", "pingpong"} <= set(entry["config"]), key
        assert entry["ms"] <= (1 - PIN_MIN_GAIN) * entry["quack_default_ms"], f"{key}: not enough faster than the default"


def test_shapes_without_a_pin_use_quacks_default():
    assert swiglu.pinned_config((9, 0), "gated", 7, 7) is None
    assert swiglu.config_key((9, 0), "dgated", 8192, 2048) == "sm90 dgated n=8192 k=2048"


def test_only_stock_silu_mlps_are_swapped(tiny_model_config):
    model = LlamaForCausalLM(tiny_model_config)
    mlps = [layer.mlp for layer in model.model.layers]
    mlps[0].config = type(mlps[0].config)(**{**mlps[0].config.to_dict(), "hidden_act": "gelu"})
    assert not swiglu.fusable(mlps[0]) and swiglu.fusable(mlps[1])
    assert swiglu.use_fused_swiglu(mlps) == len(mlps) - 1
    assert "forward" not in vars(mlps[0]) and "forward" in vars(mlps[1])
    assert set(model.state_dict()) == set(LlamaForCausalLM(tiny_model_config).state_dict()), "names unchanged"


def _cpu_accelerator():
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def test_auto_stays_off_on_cpu_and_says_why(tiny_model_config, caplog):
    model = LlamaForCausalLM(tiny_model_config)
    with caplog.at_level(logging.INFO, logger="train.engine.model"):
        apply_fused_mlp(model, TrainConfig(), _cpu_accelerator())
    assert "fused SwiGLU MLP off: it runs only on CUDA GPUs" in caplog.text
    assert all("forward" not in vars(layer.mlp) for layer in model.model.layers)


def test_true_fails_with_one_line_naming_the_key(tiny_model_config):
    cfg = TrainConfig()
    cfg.train.fused_mlp = True
    with pytest.raises(ConfigError, match=r"^train\.fused_mlp: cannot be used: it runs only on CUDA GPUs$"):
        apply_fused_mlp(LlamaForCausalLM(tiny_model_config), cfg, _cpu_accelerator())
