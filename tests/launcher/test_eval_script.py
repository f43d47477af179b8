"""`sft-launch eval`'s batch script (templates/eval.slurm.j2) against golden files, shellcheck and
bash -n, on a weird run path; and the login-node checks of `sft-launch eval` (exit 2, one line)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.commands.eval_cmd import EvalRequest, render_script
from launcher.resolve.profile import build_profile, read_cluster_file, select_profile
from tests.shellcheck import shellcheck
from tests.launcher.conftest import EXAMPLE_CLUSTER, GOLDEN_DIR, cli_env, run_cli

# CPU (one process), 8 GPUs (accelerate launch), pyxis container; a checkpoint exported first.
CASES = [("cpu", False), ("a100", False), ("h100-efa", False), ("a100", True)]
WEIRD_RUN = Path("/shared/runs/it's a $(run) dir")


def render(profile_name: str, checkpoint: bool = False) -> str:
    cluster = read_cluster_file(EXAMPLE_CLUSTER)
    name, raw = select_profile(cluster, profile_name)
    profile = build_profile(raw, name, cluster, set())
    output = WEIRD_RUN / "eval" / "leaderboard-1.json"
    flags = ["--model", str(WEIRD_RUN / "export"), "--output", str(output), "--name", "leaderboard-1",
             "--tasks", "leaderboard", "--batch-size", "auto", "--apply-chat-template"]
    model = WEIRD_RUN / ("eval/export-step-00000050" if checkpoint else "export")
    flags[1] = str(model)
    request = EvalRequest(WEIRD_RUN, model, "leaderboard-1", output, flags,
                          WEIRD_RUN / "checkpoints" / "step-00000050" if checkpoint else None)
    return render_script(request, name, profile, "0-04:00:00", allow_code_eval=False)


@pytest.mark.parametrize("profile_name, checkpoint", CASES)
def test_eval_script_matches_golden_and_passes_shellcheck(profile_name: str, checkpoint: bool, tmp_path: Path) -> None:
    text = render(profile_name, checkpoint)
    golden = GOLDEN_DIR / "eval" / f"{profile_name}{'-checkpoint' if checkpoint else ''}.slurm"
    if os.environ.get("SFT_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{golden} differs (SFT_UPDATE_GOLDEN=1 regenerates)"
    script = tmp_path / "eval.slurm"
    script.write_text(text, encoding="utf-8")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lint = shellcheck(script)
    assert lint.returncode == 0, lint.stdout
    sbatch_lines = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1" in sbatch_lines and not any("$" in line for line in sbatch_lines)


def test_eval_script_is_data_parallel_over_the_nodes_gpus() -> None:
    assert "--num_processes 8 --multi_gpu" in render("a100")
    assert "python3 -m train.evaluate" in render("cpu")  # one process: its exit code reaches the shell
    exporting = render("a100", checkpoint=True)
    assert exporting.index("-m train.export_checkpoint") < exporting.index("-m train.evaluate")


@pytest.mark.parametrize("flags, named", [
    (["--tasks", ","], "--tasks"),
    (["--limit", "0"], "--limit"),
    (["--num-fewshot", "-1"], "--num-fewshot"),
    (["--batch-size", "big"], "--batch-size"),
    (["--include-path", "/no/such/dir"], "--include-path"),
    (["--name", "a b"], "--name"),
    (["--time", "soon"], "--time"),
    (["--every-checkpoint", "--checkpoint", "2"], "--every-checkpoint"),
    (["--checkpoint", "7"], "--checkpoint 7"),
    (["--checkpoint", "abc"], "argument --checkpoint: expected a step number or 'latest', got 'abc'"),
    (["--checkpoint", "step-7"], "argument --checkpoint: expected a step number or 'latest'"),
    (["--tasks", "heldout"], "holds out no eval split"),  # the per-source view, asked for, of a run without one
    (["--tasks", "tiny_mc,heldout", "--every-checkpoint"], "--tasks heldout"),
    ([], "no exported model"),
])
def test_eval_usage_errors_are_one_line_exit_2(tmp_path: Path, flags: list[str], named: str) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.toml").write_text('[run]\ndir = "."\n')
    proc = run_cli(["eval", str(run_dir), "--executor", "local", *flags], tmp_path, cli_env())
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and named in proc.stderr
    assert not (run_dir / "eval").exists()


def test_eval_and_chat_do_not_import_torch_or_lm_eval_on_the_login_node(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "export").mkdir(parents=True)
    (run_dir / "train.toml").write_text('[run]\ndir = "."\n')
    (run_dir / "export" / "config.json").write_text("{}")
    probe = (
        "import sys, contextlib, io\n"
        "import launcher.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = launcher.cli.main(['eval', {str(run_dir)!r}, '--executor', 'local', '--dry-run', '--tasks', 'x'])\n"
        "    for command in (['chat', '--help'], ['eval', '--help']):\n"
        "        try:\n"
        "            launcher.cli.main(command)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "assert code == 0 and 'would run' in out.getvalue(), (code, out.getvalue())\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'lm_eval', 'train') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_eval_and_chat_take_a_lora_adapter_export(tmp_path: Path) -> None:
    """A LoRA run exports its adapter alone by default (no config.json): eval and chat take it."""
    run_dir = tmp_path / "run"
    (run_dir / "export").mkdir(parents=True)
    (run_dir / "train.toml").write_text('[run]\ndir = "."\n')
    (run_dir / "export" / "adapter_config.json").write_text("{}")
    proc = run_cli(["eval", str(run_dir), "--executor", "local", "--dry-run", "--tasks", "x"], tmp_path, cli_env())
    assert proc.returncode == 0 and "would run" in proc.stdout, proc.stderr
    assert str(run_dir / "export") in proc.stdout
    from launcher.ops import rundir

    assert rundir.export_dir(run_dir) == run_dir / "export"


def test_pin_links_a_complete_checkpoint_and_gives_up_on_a_pruned_one(tmp_path: Path) -> None:
    from launcher.commands.eval_watch import pin

    checkpoint = tmp_path / "checkpoints" / "step-00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    assert pin(checkpoint, tmp_path, 4) is None  # no COMPLETE marker: not a checkpoint to export
    (checkpoint / "COMPLETE").touch()
    pinned = pin(checkpoint, tmp_path, 4)
    assert pinned == tmp_path / "eval" / "pinned-step-00000004"
    assert (pinned / "model.safetensors").stat().st_ino == (checkpoint / "model.safetensors").stat().st_ino
    assert pin(tmp_path / "checkpoints" / "step-00000006", tmp_path, 6) is None  # pruned meanwhile
    assert not list((tmp_path / "eval").glob(".tmp-*"))


def test_results_of_one_source_show_its_heldout_row_and_runs_the_loss() -> None:
    from launcher.ops import evalresults

    data = {"name": "ho", "created": "2026-11-26T17:00:00+00:00", "settings": {"tasks": ["heldout"]},
            "heldout": {"sources": [{"name": "sample_chat", "loss": 2.5, "perplexity": 12.182, "tokens": 1234,
                                     "examples": 30}],
                        "all": {"loss": 2.5, "perplexity": 12.182, "tokens": 1234, "examples": 30}}}
    view = evalresults.summary(data)
    lines = evalresults.format_summary(view).splitlines()
    assert lines[1].split() == ["heldout", "loss", "perplexity", "tokens", "examples"]
    assert lines[2].split() == ["sample_chat", "2.5000", "12.182", "1,234", "30"] and len(lines) == 3  # no "all" row
    assert evalresults.short(view) == "heldout loss 2.500"
    assert evalresults.short(evalresults.summary({**data, "results": {"t": {"acc,none": 0.5}}})) == \
        "heldout loss 2.500 +1"
