"""Data that cannot fill one optimizer step on the ranks asked for is refused by the plan in one line, before
the queue (launcher/resolve/datarules.py, the training's packing rule from contract/packing.py); a run of only a
few steps is a warning."""

from __future__ import annotations

from pathlib import Path

from tests.launcher.conftest import REPO, rendered_dir, run_cli

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
LOCAL = ["plan", "--executor", "local", "--model", "tiny"]


def _data(tmp_path: Path, rows: int) -> str:
    (tmp_path / "d.jsonl").write_text("\n".join(SAMPLE[:rows]) + "\n")
    return "d.jsonl"


def test_two_short_rows_are_refused_with_the_micro_batches_they_pack_into(tmp_path: Path) -> None:
    result = run_cli([*LOCAL, "--data", _data(tmp_path, 2), "--gradient_accumulation_steps", "2"], tmp_path)
    assert result.returncode == 2, result.stdout
    assert result.stderr.strip() == (
        "sft-launch: error: data: one epoch packs into 1 micro-batch of 512 tokens, fewer than one optimizer step "
        "needs (2 data-parallel ranks x 2 accumulation = 4); add data, or lower --nodes, gradient_accumulation_steps "
        "or data.tokens_per_micro_batch")


def test_the_training_packs_into_what_the_plan_counted(tmp_path: Path) -> None:
    from contract.config import load_train_config
    from train.dataset.load import build_datasets, load_tokenizer
    from train.dataset.packing import plan_micro_batches

    result = run_cli(["--executor", "local", "--model", "tiny", "--data", _data(tmp_path, 40), "--set",
                      "data.eval_fraction=0.25", "--dry-run", "--output", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if "optimizer step" in line)
    assert warning.startswith("Warning the run is only ") and "warmup and the learning-rate schedule barely start" \
        in warning
    packed = int(warning.split("the data packs into ")[1].split()[0])
    cfg = load_train_config(rendered_dir(result) / "train.toml")
    train = build_datasets(cfg, load_tokenizer(cfg)).train
    assert len(plan_micro_batches(list(train["length"]), cfg.micro_batch_tokens, cfg.train.seed, 0)) == packed > 1
