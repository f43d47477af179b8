"""`sft-launch eval` with the real lm-evaluation-harness (HF backend, CPU) and `sft-launch chat`, on a
tiny export: custom tasks from a local YAML dir + JSONL (multiple choice and generation), offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eval_helpers import make_run, offline_env, sft_launch, write_tasks

pytest.importorskip("lm_eval", reason="the eval extra (pip install 'sft-launch[eval]') is not installed")

BLOCK_LM_EVAL = "import sys; sys.modules['lm_eval'] = None; "  # `import lm_eval` now raises ImportError


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("eval")
    return make_run(root), write_tasks(root / "tasks")


def test_eval_local_writes_results_then_status_and_runs_show_them(setup: tuple[Path, Path]) -> None:
    run_dir, tasks = setup
    env = offline_env(run_dir.parent)
    proc = sft_launch(["eval", str(run_dir), "--executor", "local", "--tasks", "tiny_mc,tiny_gen", "--include-path",
                       str(tasks), "--limit", "3", "--num-fewshot", "1", "--apply-chat-template", "--batch-size", "2",
                       "--name", "smoke"], run_dir.parent, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((run_dir / "eval" / "smoke.json").read_text())
    assert set(data["results"]) == {"tiny_mc", "tiny_gen"}
    assert data["versions"] == {"tiny_mc": 1.0, "tiny_gen": 2.0} and data["n-shot"] == {"tiny_mc": 1, "tiny_gen": 1}
    assert 0.0 <= data["results"]["tiny_mc"]["acc,none"] <= 1.0
    assert 0.0 <= data["results"]["tiny_gen"]["exact_match,none"] <= 1.0
    assert data["n-samples"]["tiny_mc"]["effective"] == 3
    assert data["configs"]["tiny_gen"]["generation_kwargs"]["max_gen_toks"] == 6
    settings = data["settings"]
    assert settings["tasks"] == ["tiny_mc", "tiny_gen"] and settings["limit"] == 3 and settings["num_fewshot"] == 1
    assert settings["apply_chat_template"] is True and settings["lm_eval_version"] == data["lm_eval_version"]
    assert data["model"] == str(run_dir / "export")
    assert "tiny_mc" in proc.stdout and (proc.stdout + proc.stderr).count("results: ") == 1
    assert "fatal: not a git repository" not in proc.stderr

    status = sft_launch(["status", str(run_dir)], run_dir.parent, env, timeout=60)
    assert status.returncode == 0 and "eval         smoke" in status.stdout and "exact_match" in status.stdout
    listing = sft_launch(["runs", "--root", str(run_dir.parent)], run_dir.parent, env, timeout=60)
    header, line = listing.stdout.splitlines()[:2]
    assert "EVAL" in header.split() and "tiny_mc acc" in line and "+1" in line


def test_eval_refuses_unsafe_code_without_the_flag(setup: tuple[Path, Path]) -> None:
    run_dir, tasks = setup
    proc = sft_launch(["eval", str(run_dir), "--executor", "local", "--tasks", "tiny_code", "--include-path",
                       str(tasks)], run_dir.parent, offline_env(run_dir.parent))
    assert proc.returncode == 2
    assert "tiny_code" in proc.stderr and "--allow-code-eval" in proc.stderr
    assert not list((run_dir / "eval").glob("tiny_code*.json"))


def test_missing_lm_eval_is_one_line_with_the_install_command(setup: tuple[Path, Path]) -> None:
    run_dir, tasks = setup
    env = offline_env(run_dir.parent)
    code = BLOCK_LM_EVAL + "from launcher.cli import main; sys.exit(main(sys.argv[1:]))"
    cli = sft_launch_python(code, ["eval", str(run_dir), "--executor", "local", "--tasks", "tiny_mc"], run_dir, env)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1
    assert "pip install 'sft-launch[eval]'" in cli.stderr
    code = BLOCK_LM_EVAL + "from train.evaluate import main; sys.exit(main(sys.argv[1:]))"
    job = sft_launch_python(code, ["--model", str(run_dir / "export"), "--output", str(run_dir / "x.json"),
                                   "--tasks", "tiny_mc"], run_dir, env)
    assert job.returncode == 2 and "pip install 'sft-launch[eval]'" in job.stderr


def sft_launch_python(code: str, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


LEADERBOARD_SELECTION = """
import json, sys
from pathlib import Path
import lm_eval
from lm_eval.tasks import TaskManager
from train.eval_tasks import select
registry = TaskManager(include_path=str(Path(lm_eval.__file__).parent / "tasks" / "leaderboard"), include_defaults=False)
selection = select(registry.task_index, ["leaderboard"], allow_code_eval=False)
print(json.dumps({"tasks": selection.tasks, "excluded": selection.excluded}))
"""


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
def test_leaderboard_preset_leaves_out_unavailable_data_with_reasons(tmp_path: Path, offline: bool) -> None:
    env = offline_env(tmp_path, HF_HOME=str(tmp_path / "empty-hf-home"))
    env.pop("HF_TOKEN", None)
    env.pop("HF_DATASETS_CACHE")
    if not offline:
        env.pop("HF_HUB_OFFLINE")
        env.pop("HF_DATASETS_OFFLINE")
    proc = sft_launch_python(LEADERBOARD_SELECTION, [], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    chosen = json.loads(proc.stdout.splitlines()[-1])
    everything = {"leaderboard_ifeval", "leaderboard_bbh", "leaderboard_gpqa", "leaderboard_math_hard",
                  "leaderboard_musr", "leaderboard_mmlu_pro"}
    assert set(chosen["tasks"]) | set(chosen["excluded"]) == everything
    assert "gated" in chosen["excluded"]["leaderboard_gpqa"]  # nothing cached, no HF_TOKEN
    if offline:  # an empty cache and no hub: nothing can be evaluated, each says why
        assert not chosen["tasks"]
        assert "not in the HF cache" in chosen["excluded"]["leaderboard_bbh"]
    else:  # downloadable public data stays in
        assert {"leaderboard_bbh", "leaderboard_musr", "leaderboard_mmlu_pro"} <= set(chosen["tasks"])


def test_chat_answers_greedily_through_the_chat_template(setup: tuple[Path, Path]) -> None:
    run_dir, _ = setup
    env = offline_env(run_dir.parent)
    question = "What is 2 plus 3?"
    talk = sft_launch(["chat", str(run_dir), "--max_new_tokens", "6", "--system", "be brief"], run_dir.parent, env,
                      timeout=120, stdin=f"{question}\n/reset\n{question}\n/exit\nnever read\n")
    assert talk.returncode == 0, talk.stderr
    replies = [line for line in talk.stdout.splitlines() if line.startswith("assistant> ")]
    assert len(replies) == 2 and replies[0] == replies[1]  # greedy by default; /reset forgot the first turn
    once = sft_launch(["chat", str(run_dir), "--prompt", question, "--max_new_tokens", "4", "--do_sample",
                       "--temperature", "0.7", "--top_k", "20"], run_dir.parent, env, timeout=120)
    assert once.returncode == 0 and "assistant> " not in once.stdout, once.stderr
    bad = sft_launch(["chat", str(run_dir), "--top_k", "many"], run_dir.parent, env, timeout=60)
    assert bad.returncode == 2 and "--top_k" in bad.stderr
    missing = sft_launch(["chat", str(run_dir.parent / "nope")], run_dir.parent, env, timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


@pytest.mark.parametrize(("flags", "words"), [
    (["--max_new_tokens", "0"], "--max_new_tokens 0: must be >= 1"),
    (["--do_sample", "--temperature", "-1"], "--temperature -1.0: must be > 0"),
    (["--do_sample", "--top_p", "1.5"], "--top_p 1.5: must be in (0, 1]"),
    (["--num_beams", "0"], "--num_beams 0: must be >= 1"),
    (["--max_new_token", "5"], "unknown flag --max_new_token; did you mean --max_new_tokens?"),  # never abbreviated
    (["--tempreature", "0.5"], "unknown flag --tempreature; did you mean --temperature?"),
], ids=["no-tokens", "negative-temperature", "top-p-above-1", "no-beams", "abbreviated", "typo"])
def test_chat_refuses_bad_generation_flags_in_one_line(setup: tuple[Path, Path], flags: list[str],
                                                       words: str) -> None:
    """A generation flag out of range or misspelt: one line (exit 2) before the model loads, not generate()'s
    traceback (exit 1) after it, nor a prefix silently taken for another flag."""
    run_dir, _ = setup
    bad = sft_launch(["chat", str(run_dir), "--prompt", "hi", *flags], run_dir.parent, offline_env(run_dir.parent),
                     timeout=120)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert bad.stderr.count("\n") == 1 and words in bad.stderr, bad.stderr


def test_an_offline_node_is_detected_and_a_hub_dataset_refused_in_one_line(setup: tuple[Path, Path]) -> None:
    """No HF_HUB_OFFLINE, no reachable Hub (HF_ENDPOINT on a closed port): one probe, then offline; a
    task whose dataset is not cached is one line (not minutes of retries and a traceback)."""
    run_dir, tasks = setup
    hub_task = tasks / "hub_mc.yaml"
    hub_task.write_text((tasks / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: hub_mc").replace(
        "dataset_path: json", "dataset_path: someorg/not-cached-anywhere"))
    env = {k: v for k, v in offline_env(run_dir.parent).items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # discard port: connection refused at once
    try:
        proc = sft_launch(["eval", str(run_dir), "--executor", "local", "--tasks", "hub_mc", "--include-path",
                           str(tasks), "--limit", "2"], run_dir.parent, env, timeout=120)
    finally:
        hub_task.unlink()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Hugging Face Hub unreachable (127.0.0.1:9: Connection refused): evaluating offline" in proc.stderr
    assert "--tasks: hub_mc: dataset someorg/not-cached-anywhere is not in the HF cache" in proc.stderr
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
