"""train.checkpoint_layers in the planner: some decoder layers checkpointed, the others keeping their activations
(launcher/plan/activations.py counts both, launcher/plan/speed.py the recompute left out), chosen by the
micro-batch search (launcher/plan/autofit.py) where a run has room, and a user's value checked before the queue."""

from __future__ import annotations

from pathlib import Path

from contract.config import ALL_LAYERS
from contract.shape import FUSED_LOSS_CHUNK_TOKENS
from launcher.plan.autofit import fit_micro_batch
from launcher.plan.planner import PlanInput, make_plan
from launcher.resolve.presets import PRESETS
from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, rendered_dir, run_cli

LLAMA_8B = ["--cluster", str(EXAMPLE_CLUSTER), "--nodes", "1", "--model", "llama3-8b", "--dry-run"]


def _qlora_70b(gpu: str, tokens: int, layers: int | str = ALL_LAYERS) -> PlanInput:
    """The llama-70b shape with QLoRA on one GPU, as bench/multi/gpu_qlora.py plans it (compiled layers)."""
    return PlanInput(arch=dict(PRESETS["llama-70b"].arch), nodes=1, gpus_per_node=1, gpu_type=gpu, lora=True,
                     quant="nf4", micro_batch_tokens=tokens, gradient_checkpointing=True, checkpoint_layers=layers,
                     loss_chunk_tokens=FUSED_LOSS_CHUNK_TOKENS, max_steps=20, compile=True)


def test_fewer_checkpointed_layers_hold_more_memory_and_predict_more_speed():
    plans = [make_plan(_qlora_70b("h200", 4096, layers)) for layers in (ALL_LAYERS, 60, 40, 20)]
    totals = [plan.gpu.total for plan in plans]
    speeds = [plan.time.tokens_per_s for plan in plans]
    assert totals == sorted(totals) and len(set(totals)) == 4, totals
    assert speeds == sorted(speeds) and len(set(speeds)) == 4, speeds
    # linear in the layers left out: each 20 more cost the same activations
    steps = {plans[i + 1].gpu.activations - plans[i].gpu.activations for i in (1, 2)}
    assert len(steps) == 1 and steps.pop() > 0


def test_the_search_leaves_out_what_fits_of_the_recompute():
    # 70B QLoRA on one H200 at 4096 tokens: all 80 layers checkpointed use a fraction of the card; no checkpointing
    # does not fit; the search keeps the fewest checkpointed layers that fit
    choice = fit_micro_batch(_qlora_70b("h200", 4096), 4096, lambda key: False)
    chosen = choice.chosen
    assert choice.checkpointing and 1 <= choice.checkpoint_layers < 80, choice.describe()
    assert chosen.fits and chosen.tokens_per_s > choice.runner_up.tokens_per_s, choice.describe()
    assert f"checkpointing of {choice.checkpoint_layers} layers (auto: fastest that fits" in choice.describe()
    assert not make_plan(_qlora_70b("h200", 4096, choice.checkpoint_layers - 1)).fits  # the fewest that fit
    assert choice.record()["checkpoint_layers"] == choice.checkpoint_layers
    # a value the user set is kept
    kept = fit_micro_batch(_qlora_70b("h200", 4096), 4096, lambda key: key == "train.checkpoint_layers")
    assert kept.checkpoint_layers == ALL_LAYERS


def test_a_user_value_is_planned_rendered_and_checked_against_the_model(roomy_tmp: Path):
    tmp_path = roomy_tmp
    env = cli_env(PATH=path_without("sbatch"))
    ok = run_cli([*LLAMA_8B, "--set", "train.checkpoint_layers=16", "--output", str(tmp_path / "ok")], tmp_path,
                 env=env)
    assert ok.returncode == 0, ok.stderr
    assert "checkpointing on (16 of 32 layers)" in ok.stdout, ok.stdout
    assert "checkpoint_layers = 16" in (rendered_dir(ok) / "train.toml").read_text()
    bad = run_cli([*LLAMA_8B, "--set", "train.checkpoint_layers=33", "--output", str(tmp_path / "bad")], tmp_path,
                  env=env)
    assert bad.returncode == 2 and not (tmp_path / "bad").exists(), bad.stderr
    assert bad.stderr.strip().splitlines()[-1].endswith(
        "train.checkpoint_layers: 33 is more than the model's 32 decoder layers (all = every one)"), bad.stderr
