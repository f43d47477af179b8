"""QLoRA on the login node: --qlora in train.toml, the planner's NF4 memory (and its loading peak), QLoRA
named when a run does not fit, and the combinations refused with one line (exit 2, nothing written)."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from contract.config import LoraSection
from contract.schema import ConfigError
from contract.shape import ModelShape, nf4_blocker
from launcher.plan.memory import NF4_BYTES_PER_PARAM, state_bytes
from launcher.plan.planner import PlanInput, make_plan, memory_options, plan_input_from_dict
from launcher.resolve.presets import PRESETS
from launcher.commands.plan_cmd import EXIT_DOES_NOT_FIT
from tests.launcher.conftest import cli_env, path_without, rendered_dir, run_cli

LLAMA70B = PRESETS["llama-70b"].arch


def _two_h100(tmp_path: Path, offload: bool = False) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(f'default_profile = "h100x2"\n[profiles.h100x2]\npartition = "gpu"\ngpus_per_node = 2\n'
                    f'gpu_type = "h100"\nstorage_root = "{tmp_path / "runs"}"\ncpu_offload = {str(offload).lower()}\n')
    return path


def _plan(tmp_path: Path, *flags: str, offload: bool = False) -> subprocess.CompletedProcess[str]:
    args = ["plan", "--cluster", str(_two_h100(tmp_path, offload)), "--model", "llama-70b", "--nodes", "1", *flags]
    return run_cli(args, tmp_path, env=cli_env(PATH=path_without("sbatch")))


def test_plan_llama70b_qlora_on_two_h100s_fits_with_nf4_weights(tmp_path: Path) -> None:
    result = _plan(tmp_path, "--qlora")
    assert result.returncode == 0, result.stderr
    assert "Verdict fits" in result.stdout and "nf4 frozen linears" in result.stdout, result.stdout
    assert "LoRA r=16" in result.stdout
    assert not (tmp_path / "runs").exists()  # plan writes nothing


def test_full_fine_tuning_that_does_not_fit_names_qlora(tmp_path: Path) -> None:
    result = _plan(tmp_path)
    assert result.returncode == EXIT_DOES_NOT_FIT, result.stderr
    assert "DOES NOT FIT" in result.stdout and "QLoRA: LoRA adapters over a 4-bit NF4 base" in result.stdout
    assert "with --qlora" in result.stdout  # the micro-batch line: what the launcher would choose under QLoRA


def test_lora_that_does_not_fit_one_gpu_names_qlora_in_the_refusal(tmp_path: Path) -> None:
    cluster = _two_h100(tmp_path)
    result = run_cli(["--cluster", str(cluster), "--model", "llama-70b", "--lora", "--set", "profile.gpus_per_node=1",
                      "--dry-run", "--output", str(tmp_path / "run")], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 2, result.stderr
    assert "--qlora" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, offload, words", [
    (["--strategy", "zero3"], False, "needs --strategy fsdp"),
    (["--strategy", "fsdp1"], False, "needs --strategy fsdp"),
    ([], True, "profile.cpu_offload: not with lora.quant"),
])
def test_qlora_refuses_other_strategies_and_offload(tmp_path: Path, flags: list[str], offload: bool,
                                                    words: str) -> None:
    result = _plan(tmp_path, "--qlora", *flags, offload=offload)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr


# A tiny model whose target linears split into whole NF4 double-quantization blocks over 2 ranks.
QUANTIZABLE_ARCH = ("model.arch={vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, "
                    "num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512}")


def test_qlora_flag_writes_lora_quant_into_train_toml(tmp_path: Path) -> None:
    result = run_cli(["--cluster", str(_two_h100(tmp_path)), "--model", "tiny", "--qlora", "--set", QUANTIZABLE_ARCH,
                      "--dry-run", "--output", str(tmp_path / "run")], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 0, result.stderr
    lora = tomllib.loads((rendered_dir(result) / "train.toml").read_text())["lora"]
    assert lora["enabled"] is True and lora["quant"] == "nf4"


def test_lora_quant_without_lora_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="lora.quant"):
        LoraSection(enabled=False, quant="nf4").validate()
    LoraSection(enabled=True, quant="nf4").validate()


def _inp(**kw: object) -> PlanInput:
    base = dict(arch=LLAMA70B, nodes=1, gpus_per_node=2, gpu_type="h100", lora=True, micro_batch_tokens=2048,
                loss_chunk_tokens=4096)
    return plan_input_from_dict(base | kw)


def test_nf4_base_is_about_a_quarter_of_bf16_and_loading_is_the_peak_on_two_gpus() -> None:
    shape = ModelShape.from_arch(LLAMA70B)
    targets = shape.target_params(list(LoraSection().target_modules))
    assert 0.9 * shape.total_params < targets < shape.total_params  # every linear but lm_head
    sharded = {quant: state_bytes(shape, memory_options(_inp(quant=quant)))["parameters"][0]
               for quant in ("none", "nf4")}
    assert 0.25 < sharded["nf4"] / sharded["none"] < 0.3  # 0.516 of 2 bytes for ~97% of the weights
    qlora = make_plan(_inp(quant="nf4"))
    # Measured on 2 H100s (bench/results/h100/qlora-llama70b-2gpu.json): 52.0 GiB allocated, at loading.
    assert qlora.gpu.peak_phase == "load/shard"
    assert abs(qlora.gpu.allocated / 2**30 - 52.0) / 52.0 < 0.15
    whole = NF4_BYTES_PER_PARAM * targets + 2 * (shape.total_params - targets)
    assert qlora.gpu.parameters > 1.5 * whole * 0.99


def test_one_gpu_qlora_8b_plan_matches_the_measured_peak() -> None:
    from bench.common.synthetic import LLAMA_8B

    plan = make_plan(_inp(arch=LLAMA_8B, gpus_per_node=1, micro_batch_tokens=8192, gradient_checkpointing=False,
                          lora_dropout=0.0, quant="nf4"))
    # bench/results/h100/single-llama3-8b-ours-qlora*.json: 61.1 GiB (compiled layers), 65.1 GiB (eager)
    for measured in (61.1, 65.1):
        assert abs(plan.gpu.allocated / 2**30 - measured) / measured < 0.15


def test_quant_needs_lora_under_fsdp2_in_the_planner() -> None:
    with pytest.raises(ConfigError, match="quant"):
        make_plan(_inp(quant="nf4", lora=False))
    with pytest.raises(ConfigError, match="quant"):
        make_plan(_inp(quant="nf4", strategy="zero3"))


def test_qlora_on_a_cpu_profile_is_planned_as_it_trains(tmp_path: Path) -> None:
    """CPU ranks train QLoRA under FSDP2 over gloo (tests/train/test_qlora_cpu.py); the planner, which sizes
    CPU ranks as full replicas, plans it too (it refused with its own internal key: "quant: ... not ddp")."""
    result = run_cli(["plan", "--executor", "local", "--model", "tiny", "--qlora", "--set", QUANTIZABLE_ARCH], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 0, result.stderr
    assert "nf4 frozen linears" in result.stdout and "FSDP2 over gloo" in result.stdout, result.stdout


@pytest.mark.parametrize("command", [["plan"], ["--dry-run", "--output", "run"]])
def test_a_model_nf4_cannot_split_over_the_ranks_is_refused_before_the_queue(tmp_path: Path,
                                                                             command: list[str]) -> None:
    """tiny's 64 x 64 q_proj is not whole NF4 double-quantization blocks (64 x 256 weights) per rank: refused
    by plan and launch in one line, as train/engine/qlora.py would refuse it on the nodes (the same rule)."""
    result = run_cli([*command, "--cluster", str(_two_h100(tmp_path)), "--model", "tiny", "--qlora"], tmp_path,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--qlora" in lines[0] and "tiny" in lines[0] and "q_proj" in lines[0], lines
    assert "2 ranks" in lines[0], lines
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_the_nf4_rule_counts_whole_blocks_and_rows_per_rank() -> None:
    shape = ModelShape.from_arch(LLAMA70B)
    targets = list(LoraSection().target_modules)
    assert shape.nf4_blocker(targets, world=16) is None
    assert nf4_blocker((64, 256), world=1) is None
    assert "2 ranks" in (nf4_blocker((64, 256), world=2) or "")
    assert nf4_blocker((3, 16384 * 3), world=2) is not None  # whole blocks, but rows that do not divide
    assert "q_proj" in (ModelShape.from_arch(PRESETS["tiny"].arch).nf4_blocker(targets, world=1) or "")
