"""A default that fits (issue #11): launcher/plan/autofit.py's micro-batch search, and the headline
commands through the real CLI (plan printed, run directory rendered, choice recorded, refusals)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, rendered_dir, run_cli
from launcher.plan.autofit import MIN_MICRO_BATCH_TOKENS, Rules, Trial, _trial, best, candidates, search
from launcher.plan.planner import PlanInput, make_plan
from launcher.resolve.presets import PRESETS

EXAMPLE = ["--cluster", str(EXAMPLE_CLUSTER)]  # default_profile = "a100": 8 x A100 80GB per node
HEADLINE_70B = [*EXAMPLE, "--nodes", "2", "--model", "llama-70b", "--dry-run"]
HEADLINE_8B = [*EXAMPLE, "--nodes", "1", "--model", "llama3-8b", "--dry-run"]


def _a100(model: str, nodes: int, tokens: int, checkpointing: bool = True) -> PlanInput:
    """The planner's view of the a100 example profile (fused loss on and compiled decoder layers, as
    train.toml's defaults resolve on GPUs; no fused MLP on an A100)."""
    return PlanInput(arch=dict(PRESETS[model].arch), nodes=nodes, gpus_per_node=8, gpu_type="a100",
                     micro_batch_tokens=tokens, gradient_checkpointing=checkpointing, loss_chunk_tokens=4096,
                     compile=True)


def _cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--output", str(tmp_path / "run")], tmp_path, env=cli_env(PATH=path_without("sbatch")))


def _written(result: subprocess.CompletedProcess[str]) -> tuple[dict, dict]:
    """train.toml and run.json as the dry run rendered them."""
    run = rendered_dir(result)
    return (tomllib.loads((run / "train.toml").read_text()), json.loads((run / "run.json").read_text()))


# --------------------------------------------------------------------------- the search


@pytest.mark.parametrize(("default", "expected"), [
    (16384, [16384, 8192, 4096, 2048, 1024, 512, 256]),
    (12000, [12000, 8192, 4096, 2048, 1024, 512, 256]),  # not a power of two: the powers below it
    (512, [512, 256]), (300, [300, 256]), (256, [256]), (100, [100]),  # never below the floor but the default
])
def test_candidates_are_the_default_then_powers_of_two_down_to_the_floor(default: int, expected: list[int]) -> None:
    assert candidates(default) == expected and MIN_MICRO_BATCH_TOKENS == 256


def test_memory_falls_monotonically_with_the_micro_batch_and_with_checkpointing() -> None:
    inp = _a100("llama-70b", 2, 16384)
    for checkpointing in (True, False):
        totals = [_trial(inp, tokens, checkpointing).total_gib for tokens in candidates(16384)]
        assert totals == sorted(totals, reverse=True) and len(set(totals)) == len(totals), totals
    assert all(_trial(inp, t, True).total_gib < _trial(inp, t, False).total_gib for t in candidates(16384))


def _chosen(trials):
    return best([t for t in trials if t.fits])


def test_the_fastest_setting_that_fits_is_chosen_not_the_largest() -> None:
    # 8B on 8 A100s, 2k-token documents: 32768 tokens fit with checkpointing, but 8192 without checkpointing
    # fits too and skips the forward's recompute: more predicted tokens/s (issue #55)
    trials = search(_a100("llama3-8b", 1, 32768), Rules(False, 2048))
    largest = max((t for t in trials if t.fits), key=lambda t: t.tokens)
    chosen = _chosen(trials)
    assert (largest.tokens, largest.checkpointing) == (32768, True)
    assert (chosen.tokens, chosen.checkpointing) == (8192, False)
    assert chosen.tokens_per_s > largest.tokens_per_s
    assert all(chosen.tokens_per_s >= t.tokens_per_s for t in trials if t.fits and t.whole)


def test_the_70b_boundary_without_offload_or_context_parallel() -> None:
    inp = _a100("llama-70b", 2, 16384)
    trials = search(inp, Rules(checkpointing_fixed=True, model_max_length=4096))
    assert [t.tokens for t in trials] == [16384, 8192, 4096, 2048, 1024, 512, 256]
    assert (_chosen(trials).tokens, _chosen(trials).whole) == (2048, False)  # the only way then: documents cut
    # the boundary, straight from the planner: 2048 fits the 76.0 usable GiB of an A100 80GB, 4096 does not
    assert make_plan(dataclasses.replace(inp, micro_batch_tokens=2048)).fits is True
    assert make_plan(dataclasses.replace(inp, micro_batch_tokens=4096)).fits is False


def test_whole_documents_rank_above_any_faster_setting_that_cuts_them() -> None:
    inp = _a100("llama-70b", 2, 16384)
    trials = search(inp, Rules(False, 4096, offload_fixed=False, context_fixed=False))
    chosen = _chosen(trials)
    assert chosen.whole and chosen.tokens >= 4096 and chosen.checkpointing
    assert chosen.activation_offload or chosen.context_parallel > 1  # what makes 4096+ fit on 80 GB
    cut = [t for t in trials if t.fits and not t.whole]
    assert cut and all(Trial.rank(chosen) > Trial.rank(t) for t in cut)


def test_a_default_that_fits_and_runs_fastest_is_kept() -> None:
    trials = search(_a100("llama3-8b", 1, 32768), Rules(True, 8192))
    assert _chosen(trials) is trials[0] and trials[0].tokens == 32768


def test_checkpointing_is_turned_on_before_documents_are_cut() -> None:
    # model_max_length 16384: compiled, 8B without checkpointing fits 8 A100s at 8192 tokens, not at 16384
    trials = search(_a100("llama3-8b", 1, 32768, checkpointing=False), Rules(False, 16384))
    chosen = _chosen(trials)
    assert chosen.checkpointing and chosen.whole and chosen.tokens >= 16384
    assert not any(t.fits for t in trials if not t.checkpointing and t.whole)


def test_settings_the_user_fixed_are_never_changed() -> None:
    inp = _a100("llama3-8b", 1, 32768, checkpointing=False)
    trials = search(inp, Rules(True, 16384))  # checkpointing, offload and context parallel fixed
    assert not any(t.checkpointing or t.activation_offload or t.context_parallel != 1 for t in trials)
    assert _chosen(trials).tokens == 8192  # below model_max_length: documents are cut


def test_nothing_fits_down_to_the_floor() -> None:
    trials = search(_a100("llama-70b", 1, 16384), Rules(False, 4096))
    assert min(t.tokens for t in trials) == MIN_MICRO_BATCH_TOKENS and not any(t.fits for t in trials)


# --------------------------------------------------------------------------- the headline commands


def test_headline_70b_on_two_a100_nodes_fits_and_states_its_micro_batch(roomy_tmp: Path) -> None:
    result = _cli(HEADLINE_70B, roomy_tmp)
    assert result.returncode == 0, result.stderr
    assert "Verdict fits" in result.stdout and "dry run: nothing submitted" in result.stdout
    # issue #55: >= 4096 tokens per GPU, whole 4096-token documents: the checkpointed layer inputs offloaded to
    # pinned host memory (5.4 GB a GPU at 4096 tokens) free what 4096 lacked (77.5 of 76.0 GiB without)
    assert "Micro   8192 tokens, activation offload (auto: fastest that fits in 76.0 GiB: 75.0 GiB" in result.stdout
    assert "; runner-up 4096 tokens, checkpointing, activation offload, ~" in result.stdout
    assert "micro-batch 8192 tok x GA 1" in result.stdout and "cut to it" not in result.stdout
    assert "tok/s predicted" in result.stdout and "1B tokens in " in result.stdout
    train, run = _written(result)
    assert train["data"]["tokens_per_micro_batch"] == 8192 and train["train"]["gradient_checkpointing"] is True
    assert train["train"]["activation_offload"] is True and train.get("parallel", {}).get("context", 1) == 1
    assert train["train"]["gradient_accumulation_steps"] == 1
    assert "# Micro-batch chosen by sft-launch" in (rendered_dir(result) / "train.toml").read_text()
    choice = run["micro_batch"]
    assert (choice["tokens"], choice["source"], choice["usable_gib"]) == (8192, "auto", 76.0)
    assert choice["activation_offload"] is True and choice["tokens_per_s"] > 0
    fitting = [t for t in choice["trials"] if t["fits"]]
    assert max(t["tokens_per_s"] for t in fitting if t["whole"]) == choice["tokens_per_s"]


def test_headline_70b_trains_8k_documents_whole(roomy_tmp: Path) -> None:
    # issue #54: `--model_max_length 8192` on the headline plan keeps 8k-token documents whole
    result = _cli([*HEADLINE_70B, "--model_max_length", "8192"], roomy_tmp)
    assert result.returncode == 0, result.stderr
    assert "Micro   8192 tokens, activation offload (auto: fastest" in result.stdout
    assert "cut to it" not in result.stdout
    train, _ = _written(result)
    assert train["data"]["tokens_per_micro_batch"] >= 8192 and train["train"]["model_max_length"] == 8192


def test_headline_8b_on_one_a100_node_keeps_its_default(roomy_tmp: Path) -> None:
    result = _cli(HEADLINE_8B, roomy_tmp)
    assert result.returncode == 0, result.stderr
    # 32768 tokens (the default) fit with checkpointing; 8192 without it fit too and skip the recompute: faster
    assert "Verdict fits" in result.stdout and "Micro   8192 tokens (auto: fastest that fits" in result.stdout
    assert "runner-up" in result.stdout
    train, run = _written(result)
    assert train["data"]["tokens_per_micro_batch"] == 8192 and train["train"]["gradient_checkpointing"] is False
    assert run["micro_batch"]["source"] == "auto" and run["micro_batch"]["tokens"] == 8192


def test_plan_json_carries_the_choice(roomy_tmp: Path) -> None:
    # A 70B run's checkpoints on a file system with a cluster's room: plan's disk verdict is "fits" too
    result = run_cli(["plan", *HEADLINE_70B[:-1], "--json", "--output", str(roomy_tmp / "run")], roomy_tmp,
                     env=cli_env(PATH=path_without("sbatch")))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] is True and data["input"]["micro_batch_tokens"] == 8192
    assert data["micro_batch"]["source"] == "auto" and data["micro_batch"]["tokens"] == 8192


def test_a_user_fixed_micro_batch_is_never_changed_and_its_refusal_names_what_fits(roomy_tmp: Path) -> None:
    for fixed in (["--set", "data.tokens_per_micro_batch=4096"], ["--per_device_train_batch_size", "1"]):
        result = _cli([*HEADLINE_70B, *fixed], roomy_tmp)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "does not fit: GPU memory (77.5 GiB per GPU of 76.0 usable)" in line, line
        assert "(--nodes 3)" in line and "--set data.tokens_per_micro_batch=2048" in line, line
        assert "Micro " not in result.stdout and "micro-batch 4096 tok" in result.stdout
        assert not (roomy_tmp / "run").exists()
    result = _cli([*HEADLINE_70B, "--set", "data.tokens_per_micro_batch=2048"], roomy_tmp)
    assert result.returncode == 0, result.stderr
    train, run = _written(result)
    assert train["data"]["tokens_per_micro_batch"] == 2048 and run["micro_batch"] is None


def test_checkpointing_turned_off_by_the_user_is_left_off(roomy_tmp: Path) -> None:
    result = _cli([*HEADLINE_8B, "--gradient_checkpointing", "false"], roomy_tmp)
    assert result.returncode == 0, result.stderr
    # compiled layers (train.compile auto): 8192 tokens fit 8 A100s without checkpointing, 16384 do not
    assert "Micro   8192 tokens (auto: fastest" in result.stdout and "16384 needs" in result.stdout
    train, _ = _written(result)
    assert train["train"]["gradient_checkpointing"] is False and train["data"]["tokens_per_micro_batch"] == 8192


def test_refusal_when_no_micro_batch_fits_names_the_settings_that_would(tmp_path: Path) -> None:
    result = _cli([*EXAMPLE, "--nodes", "1", "--model", "llama-70b", "--dry-run"], tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "does not fit: GPU memory" in line and "try: use 2 nodes (--nodes 2)" in line, line
    assert "(--lora)" in line and "--force" in line
    assert "Micro   none fits: even 256 tokens with checkpointing needs" in result.stdout
    assert "would choose 8192 with --nodes 2" in result.stdout
    assert not (tmp_path / "run").exists()


def test_a_model_max_length_the_user_set_keeps_documents_whole() -> None:
    trials = search(_a100("llama-70b", 2, 16384), Rules(False, 4096, cut_documents=False))
    assert {t.tokens for t in trials} == {16384, 8192, 4096} and not any(t.fits for t in trials)


def test_refusal_for_a_user_set_model_max_length_names_cutting_and_more_nodes(tmp_path: Path) -> None:
    fixed = ["--context_parallel", "1", "--set", "train.activation_offload=false"]  # the user's: never changed
    result = _cli([*HEADLINE_70B, "--model_max_length", "4096", *fixed], tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "try: micro_batch_tokens=2048 (documents cut to it) (--set data.tokens_per_micro_batch=2048)" in line
    assert "use 3 nodes (--nodes 3)" in line, line
    assert "model_max_length is yours: documents are kept whole" in result.stdout
    assert not (tmp_path / "run").exists()
