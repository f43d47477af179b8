"""Expert parallelism (parallel.expert, train/moe/expert_parallel.py) on CPU over gloo.

- a tiny Qwen3-MoE (8 experts, top-2) with its experts split over 2 and over 4 ranks (FSDP2 as training
  shards it) equals the same model on one rank with transformers' own MoE forward (EP 1): loss 1e-5,
  every gradient 1e-4, with uneven expert loads and experts that get no token (zero gradients), with
  a router that sends no token to the last rank's experts, composed with context parallelism over the same
  ranks, and an eval forward (tests/train/workers/expert_parallel.py);
- a real 2-rank training with parallel.expert = 2 stopped at step 2 and resumed reproduces the uninterrupted
  EP run bitwise (losses, the final eval loss, the exported weights), its checkpoint whole expert tensors.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from contract.protocol import EXIT_REQUEUE, free_port
from tests.faults import STOP_AT_STEP_ENV
from tests.train.conftest import TINY_TOKENIZER_DIR
from tests.train.run_helpers import REPO, exported_tensors, launch_env, metrics, read_log, run_training, write_run

WORKER = Path(__file__).parent / "workers" / "expert_parallel.py"


@pytest.mark.slow
@pytest.mark.parametrize(("ranks", "size"), [(2, 2), (4, 4), (4, 2)])
def test_expert_parallel_equals_one_rank(ranks, size):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                           "--master_port", str(free_port()), str(WORKER), str(size)], cwd=REPO, env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 3 * ranks  # uneven loads; a rank with no token; with context parallelism


MOE_ARCH = dict(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                norm_topk_prob=True, max_position_embeddings=512, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory) -> dict:
    """A tiny random Qwen3-MoE checkpoint (8 experts, top-2) and the shipped tokenizer."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    folder = tmp_path_factory.mktemp("qwen3moe")
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**MOE_ARCH)).save_pretrained(folder)
    return {"path": str(folder), "arch": {}, "tokenizer": str(TINY_TOKENIZER_DIR), "layer_class": "Qwen3MoeDecoderLayer"}


def _moe_run(run_dir: Path, model: dict, expert: int) -> Path:
    settings = {"model": model, "parallel": {"expert": expert}, "data": {"eval_fraction": 0.05},
                "train": {"max_steps": 4, "logging_steps": 1}}  # the final eval runs under EP too
    write_run(run_dir, settings)
    yaml = run_dir / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("LlamaDecoderLayer", model["layer_class"]))
    return run_dir


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def _checkpoint_shape(run_dir: Path, name: str) -> list[int]:
    from accelerate.utils.constants import FSDP_MODEL_NAME
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint = sorted((run_dir / "checkpoints").glob("step-*"))[0]
    tensors = FileSystemReader(str(checkpoint / f"{FSDP_MODEL_NAME}_0")).read_metadata().state_dict_metadata
    return list(next(meta.size for key, meta in tensors.items() if key.endswith(name)))


def _eval_losses(run_dir: Path) -> list[float]:
    return [r["eval_loss"] for r in metrics(run_dir) if "eval_loss" in r]


@pytest.mark.slow
def test_expert_parallel_training_resumes_bitwise(tmp_path, moe_model):
    """2 ranks, EP 2: stopped at step 2 and resumed, the run reproduces the uninterrupted one bitwise
    (losses, the final eval loss under EP, the exported weights, every expert); the checkpoint holds
    the whole [E, ...] expert tensors."""
    reference = _moe_run(tmp_path / "reference", moe_model, 2)
    assert run_training(reference) == 0, read_log(reference)
    assert "expert parallel: 2 MoE layers" in read_log(reference)
    assert 0 < _eval_losses(reference)[0] < 10

    run_dir = _moe_run(tmp_path / "run", moe_model, 2)
    code = run_training(run_dir, {STOP_AT_STEP_ENV: "2"}, log_name="first.log")
    assert code in (EXIT_REQUEUE, 1) and "exitcode  : 75" in read_log(run_dir, "first.log"), read_log(run_dir, "first.log")
    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    assert "resumed from" in read_log(run_dir, "second.log")
    assert _checkpoint_shape(run_dir, "model.layers.0.mlp.experts.gate_up_proj") == [8, 64, 64]  # whole, in DCP
    assert _losses(run_dir) == _losses(reference)
    assert _eval_losses(run_dir) == _eval_losses(reference) and len(_eval_losses(run_dir)) == 1
    exported, whole = exported_tensors(run_dir), exported_tensors(reference)
    assert exported.keys() == whole.keys() and "model.layers.1.mlp.experts.7.down_proj.weight" in whole  # all 8
    assert all(torch.equal(exported[name], tensor) for name, tensor in whole.items())


def test_what_cannot_split_is_refused_in_one_line():
    from contract.schema import ConfigError
    from transformers import GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM

    from tests.train.conftest import TINY_ARCH
    from train.moe import expert_parallel

    with pytest.raises(ConfigError, match=r"^parallel.expert: 3 does not divide the model's 8 experts$"):
        expert_parallel.setup(3, 3, 0, 8, "qwen3_moe")
    with pytest.raises(ConfigError, match="parallel.expert: gpt_oss models are not supported yet"):
        expert_parallel.setup(2, 2, 0, 32, "gpt_oss")
    with pytest.raises(ConfigError, match="parallel.expert: the model has no mixture-of-experts layers"):
        expert_parallel.setup(2, 2, 0, None, "llama")
    assert not expert_parallel.setup(1, 2, 0, None).enabled
    ep = expert_parallel.ExpertParallel(2, 0, None)
    with pytest.raises(ConfigError, match="no mixture-of-experts layer"):
        expert_parallel.apply(LlamaForCausalLM(LlamaConfig(**TINY_ARCH)), ep)
    gpt_oss = GptOssForCausalLM(GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=16, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                             num_local_experts=4, num_experts_per_tok=2))
    with pytest.raises(ConfigError, match="MoE block GptOssMLP is not supported"):
        expert_parallel.apply(gpt_oss, ep)
