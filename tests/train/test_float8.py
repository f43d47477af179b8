"""FP8 training on the training side, what a CPU host can show (tests/train/test_gpu_fp8.py runs it on
an FP8 GPU): which layers become float8 linears (ours for tensorwise, torchao's for its recipes), and the
one-line refusal (exit 2) of a CPU run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from contract.failure import first_failure
from tests.train.conftest import TINY_ARCH
from tests.train.run_helpers import REPO, launch_env, write_run
from train.kernels.float8 import TORCHAO_RECIPES, convert_decoder_linears
from train.kernels.fp8_linear import Float8TrainingLinear
from train.kernels.perf import decoder_layers


def _float8_names(model: torch.nn.Module) -> set[str]:
    from torchao.float8.float8_linear import Float8Linear

    return {name for name, module in model.named_modules() if isinstance(module, Float8Linear | Float8TrainingLinear)}


@pytest.mark.parametrize("recipe", ["tensorwise", "torchao-tensorwise"])
def test_decoder_linears_become_float8_and_lm_head_stays(recipe: str) -> None:
    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH))
    names_before = [name for name, _ in model.named_parameters()]
    assert convert_decoder_linears(decoder_layers(model), recipe, fast_accum=True) == 7 * TINY_ARCH["num_hidden_layers"]
    kinds = {type(module).__name__ for name, module in model.named_modules() if name.endswith("proj")}
    assert kinds == {"Float8TrainingLinear" if recipe == "tensorwise" else "Float8Linear"}
    converted = _float8_names(model)
    assert "lm_head" not in {name.split(".")[-1] for name in converted}
    assert {name.split(".")[-1] for name in converted} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"}
    assert [name for name, _ in model.named_parameters()] == names_before  # checkpoints and export unchanged


def test_a_packed_micro_batch_of_any_length_trains() -> None:
    """The weight gradient's FP8 GEMM contracts over the tokens: 37 of them (not a multiple of 16) are padded
    inside it (an H100 refused 2,430 before `pad_inner_dim`)."""
    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH))
    convert_decoder_linears(decoder_layers(model), "tensorwise", fast_accum=True)
    assert all(m.config.pad_inner_dim for m in model.modules() if hasattr(m, "config") and hasattr(m.config, "pad_inner_dim"))
    ids = torch.randint(0, TINY_ARCH["vocab_size"], (1, 37))
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.model.layers[0].mlp.down_proj.weight.grad is not None


@pytest.mark.parametrize("recipe", ["torchao-tensorwise", "rowwise"])
@pytest.mark.parametrize("fast_accum", [True, False])
def test_fast_accumulation_is_the_forward_gemms_switch_alone(recipe: str, fast_accum: bool) -> None:
    """train.fp8_fast_accum decides the forward GEMM's accumulation; the backward GEMMs accumulate in fp32
    under either setting, and the recipe's scaling is untouched (our tensorwise layer: its backward op
    has no such switch, train/kernels/fp8_linear.py)."""
    from torchao.float8 import Float8LinearConfig

    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH))
    convert_decoder_linears(decoder_layers(model), recipe, fast_accum=fast_accum)
    stock = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES.get(recipe, recipe))
    configs = [m.config for m in model.modules() if type(m).__name__ == "Float8Linear"]
    assert configs and all(c.gemm_config_output.use_fast_accum is fast_accum for c in configs)
    assert all(not c.gemm_config_grad_input.use_fast_accum and not c.gemm_config_grad_weight.use_fast_accum
               for c in configs)
    assert all(c.cast_config_input == stock.cast_config_input and c.cast_config_grad_output == stock.cast_config_grad_output
               for c in configs)


def test_layers_off_the_16_alignment_stay_bf16() -> None:
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_ARCH, "intermediate_size": 120}))  # 120 % 16 = 8
    convert_decoder_linears(decoder_layers(model), "rowwise", fast_accum=True)
    kinds = {name.split(".")[-1] for name in _float8_names(model)}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj"}


def test_a_cpu_run_is_refused_in_one_line(tmp_path) -> None:
    run = write_run(tmp_path / "run", {"train": {"precision": "fp8", "max_steps": 2}}, processes=1)
    proc = subprocess.run([sys.executable, "-m", "train", "--config", str(run / "train.toml")], cwd=REPO,
                          env=launch_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = first_failure(run)
    assert record is not None and record["exit_code"] == 2, record
    assert record["message"].startswith("train.precision: fp8 cannot be used: float8 matmuls need a CUDA GPU")
    assert not (run / "checkpoints").exists() and not (run / "export").exists()
