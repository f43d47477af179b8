"""Several sources from the command line: repeated --data and a [[data.sources]] file become train.toml's
[data] table, one --data stays today's data.path, hub ids are checked in the profile's HF cache, and
the plan prints the per-source table (launcher/resolve/data_args.py, launcher/resolve/preflight.py,
launcher/resolve/plan_sources.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from contract.schema import ConfigError
from launcher.resolve.data_args import resolve_data_path
from tests.hub_fixture import build_hub_cache
from tests.launcher.conftest import REPO, cli_env, rendered_dir, run_cli

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
QA = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(900)]
LOCAL = ["--executor", "local", "--model", "tiny"]


def _files(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "chat.jsonl").write_text("\n".join(SAMPLE[:20]) + "\n")
    (root / "text.jsonl").write_text("".join(json.dumps({"text": f"note {i}"}) + "\n" for i in range(40)))
    (root / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in QA))
    (root / "mix.toml").write_text(
        '[[data.sources]]\npath = "chat.jsonl"\neval_fraction = 0.1\n'
        '[[data.sources]]\npath = "qa.jsonl"\nformat = "prompt_completion"\nweight = 0.25\n'
        'columns = {prompt = "question", completion = "answer"}\nsystem_prompt = "Add."\n')
    return root


def _cluster_with_hf_home(root: Path) -> None:
    (root / "cluster.toml").write_text(
        'default_profile = "cpu"\n[profiles.cpu]\npartition = "cpu"\ngpus_per_node = 0\nprocesses_per_node = 1\n'
        'backend = "gloo"\ntime = "1:00:00"\nsignal_lead_s = 60\nstorage_root = "runs"\n'
        f'hf_home = "{root / "hf_home"}"\n')


def _train_toml(run: Path) -> dict:
    return tomllib.loads((run / "train.toml").read_text())


def test_one_data_flag_renders_data_path_as_before(tmp_path: Path) -> None:
    _files(tmp_path)
    result = run_cli([*LOCAL, "--data", "chat.jsonl", "--dry-run", "--output", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 0, result.stderr
    data = _train_toml(rendered_dir(result))["data"]
    assert data["path"] == str(tmp_path / "chat.jsonl") and "sources" not in data
    assert "Sources " not in result.stdout  # one plain source: no table


def test_repeated_data_flags_become_sources_with_weights(tmp_path: Path) -> None:
    _files(tmp_path)
    result = run_cli([*LOCAL, "--data", "chat.jsonl", "--data", "text.jsonl:0.5", "--dry-run",
                      "--output", str(tmp_path / "run")], tmp_path)
    assert result.returncode == 0, result.stderr
    data = _train_toml(rendered_dir(result))["data"]
    assert data["path"] == "" and [(s["path"], s["weight"]) for s in data["sources"]] == [
        (str(tmp_path / "chat.jsonl"), 1.0), (str(tmp_path / "text.jsonl"), 0.5)]
    assert "[[data.sources]]" in (rendered_dir(result) / "train.toml").read_text()


def test_plan_prints_a_row_per_source(tmp_path: Path) -> None:
    _files(tmp_path / "data")
    result = run_cli(["plan", *LOCAL, "--data", "data/mix.toml", "--num_train_epochs", "2"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Sources "))
    assert lines[at].split() == ["Sources", "source", "rows", "tokens", "weight", "share", "epochs", "eval", "dropped"]
    chat, qa = (lines[at + 1].split(), lines[at + 2].split())
    assert chat[:2] == ["chat", "20"] and chat[3] == "x1" and chat[5:] == ["2.00", "2", "0"]
    assert qa[:2] == ["qa", "900"] and qa[3] == "x0.25" and qa[5:] == ["0.50", "0", "0"]
    shares = [float(row[4].rstrip("%")) for row in (chat, qa)]
    assert abs(sum(shares) - 100) < 0.2 and shares[1] > shares[0]  # 225 Q&A rows outweigh 18 chats
    assert any(line.startswith("Checked qa qa.jsonl: 900 rows checked (prompt_completion)") for line in lines)
    assert any(line.startswith("Data    ~") and "243 rows" in line for line in lines)  # 18 + 225 per epoch


def test_a_hub_dataset_is_read_from_the_profiles_hf_cache(tmp_path: Path) -> None:
    chats = [json.loads(line) for line in SAMPLE[:12]]
    build_hub_cache(tmp_path / "hf_home", "sft-test/chats", {"train": chats[:10], "test": chats[10:]})
    _cluster_with_hf_home(tmp_path)
    (tmp_path / "hub.toml").write_text('[[data.sources]]\npath = "sft-test/chats"\neval_split = "test"\n'
                                       '[[data.sources]]\npath = "chat.jsonl"\nweight = 2\n')
    (tmp_path / "chat.jsonl").write_text("\n".join(SAMPLE[12:32]) + "\n")  # none of the hub's eval rows
    result = run_cli(["plan", "--cluster", "cluster.toml", "--model", "tiny", "--data", "hub.toml"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Checked chats sft-test/chats: 10 rows checked (sharegpt), from the HF cache" in result.stdout
    assert "Checked chats (eval) sft-test/chats: 2 rows checked (sharegpt), from the HF cache" in result.stdout
    missing = run_cli(["plan", "--cluster", "cluster.toml", "--model", "tiny", "--data", "sft-test/absent"], tmp_path)
    assert missing.returncode == 2
    cache, home = tmp_path / "hf_home" / "datasets", tmp_path / "hf_home"
    assert missing.stderr.strip() == (
        f"sft-launch: error: --data sft-test/absent: not in the HF datasets cache ({cache}) and the hub is not "
        f"read from here (offline); on a machine with network run: HF_HOME={home} python -c \"import datasets; "
        "datasets.load_dataset('sft-test/absent', split='train')\" and copy the cache over")


def test_status_shows_the_newest_eval_loss_per_source() -> None:
    from launcher.ops import status

    records = [{"step": 10, "eval_loss": 2.5, "eval_loss/chat": 2.0, "eval_loss/qa": 3.0},
               {"step": 12, "loss": 2.4}, {"step": 20, "eval_loss": 2.25, "eval_loss/chat": 2.0, "eval_loss/qa": 2.5}]
    latest = status._latest_eval_loss(records)
    assert status._eval_loss_line(latest) == "eval loss    2.2500 (chat 2.0000, qa 2.5000) at step 20"
    assert status._latest_eval_loss(records[1:2]) is None


def test_tool_calls_are_checked_against_a_cached_hub_models_template(tmp_path: Path) -> None:
    """A model given by HF id (in the profile's HF cache): its template must render the tool calls."""
    tokenizer = REPO / "train" / "assets" / "tiny-tokenizer"
    snapshot = tmp_path / "hf_home" / "hub" / "models--org--tool-less" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512}))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (snapshot / name).write_bytes((tokenizer / name).read_bytes())
    _cluster_with_hf_home(tmp_path)
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "get_weather", "arguments": {"city": "Lima"}}}]}
    row = {"messages": [{"role": "user", "content": "Weather?"}, call, {"role": "tool", "content": "sunny"},
                        {"role": "assistant", "content": "Sunny."}]}
    (tmp_path / "tools.jsonl").write_text(json.dumps(row) + "\n")
    result = run_cli(["plan", "--cluster", "cluster.toml", "--model", "org/tool-less", "--data", "tools.jsonl"],
                     tmp_path, env=cli_env(HF_HOME=str(tmp_path / "hf_home")))
    assert result.returncode == 2
    assert f"error: {tmp_path / 'tools.jsonl'}:1: the chat template leaves out messages[1]: tool call 'get_weather' " \
           f"(call 1 of that name) (1 of 1 rows of source 'tools' cannot be rendered exactly by {snapshot}'s chat " \
           "template" in result.stderr


def test_data_flags_resolve_by_contracts_hub_id_rule(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").write_text("{}\n")
    assert resolve_data_path("org/name") == str(tmp_path / "org" / "name")  # exists: made absolute
    assert resolve_data_path("org/other") == "org/other"  # a hub id, kept as given
    for value in ("a/b/c", "missing.jsonl", "./org/other", "notes.txt"):
        with pytest.raises(ConfigError, match=f"--data {value}: no such file"):
            resolve_data_path(value)


READS_THE_HUB_DATASET = '''
import os, pathlib, sys, tomllib
from contract.readers import iter_hub_rows
config_path = pathlib.Path(sys.argv[sys.argv.index("--config") + 1])
source = tomllib.loads(config_path.read_text())["data"]["path"]
rows = sum(1 for _ in iter_hub_rows(source, "", "train", "", "data.path"))  # what train/dataset/load.py reads
(config_path.parent / "read.txt").write_text(f"{os.environ.get('HF_HOME')} {rows}")
'''


def test_a_hub_id_plan_accepts_is_read_by_a_local_run_from_the_same_cache(tmp_path: Path) -> None:
    """--executor local starts training with the profile's HF_HOME (as the job script exports it), whatever
    this shell's HF_HOME / HF_DATASETS_CACHE say: the cache `plan` checked is the one the run reads."""
    from tests.launcher.test_local_executor import _stand_in_env

    chats = [json.loads(line) for line in SAMPLE[:12]]
    build_hub_cache(tmp_path / "hf_home", "sft-test/chats", {"train": chats})
    (tmp_path / "cluster.toml").write_text(
        'default_profile = "cpu"\n[profiles.cpu]\ngpus_per_node = 0\nprocesses_per_node = 1\nbackend = "gloo"\n'
        f'time = "1:00:00"\nsignal_lead_s = 60\nhf_home = "{tmp_path / "hf_home"}"\n')
    env = _stand_in_env(tmp_path, READS_THE_HUB_DATASET) | {"HF_HOME": str(tmp_path / "elsewhere"),
                                                            "HF_DATASETS_CACHE": str(tmp_path / "elsewhere")}
    args = ["--cluster", "cluster.toml", "--model", "tiny", "--data", "sft-test/chats"]
    assert run_cli(["plan", *args], tmp_path, env=env).returncode == 0
    result = run_cli([*args, "--executor", "local", "--output", str(tmp_path / "run")], tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "run" / "read.txt").read_text() == f"{tmp_path / 'hf_home'} 12"


def test_a_large_sources_count_is_sampled_said_and_cached(tmp_path: Path) -> None:
    """The plan counts the first SAMPLE_ROWS rows with the tokenizer, says so, and keeps the count beside
    the data (.NAME.tokens.json) for the next plan; the row count comes from the check of every row."""
    from types import SimpleNamespace

    from contract.config import TrainConfig
    from launcher.plan.tokencount import SAMPLE_ROWS
    from launcher.resolve import plan_sources
    from launcher.resolve.profile import ClusterProfile

    rows = [{"prompt": f"Spell {i} in words, please, and add a short note on it.", "completion": "x" * 400}
            for i in range(3000)]
    data = tmp_path / "big.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = TrainConfig()
    cfg.data.sources = [plan_sources.DataSource(str(data), name="big")]
    launch = SimpleNamespace(profile=ClusterProfile(), train=cfg, data_checks=[])
    first = plan_sources.estimate_source(launch, cfg.data.sources[0])
    assert first.method == f"the first {SAMPLE_ROWS:,} rows counted with tiny-tokenizer's tokenizer"
    assert first.rows == 3000 and (tmp_path / ".big.jsonl.tokens.json").is_file()
    plan_sources._COUNTED.clear()  # as a new process would: from the file beside the data
    assert plan_sources.estimate_source(launch, cfg.data.sources[0]) == first


def test_a_cached_hub_models_tokenizer_without_a_chat_template_is_refused_for_chat_data(tmp_path: Path) -> None:
    """Its snapshot's tokenizer.json counts the tokens (no chars/3.5 fallback), and chat data needs a template."""
    tokenizer = REPO / "train" / "assets" / "tiny-tokenizer"
    snapshot = tmp_path / "hf_home" / "hub" / "models--org--base" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 512}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).write_bytes((tokenizer / name).read_bytes())
    _cluster_with_hf_home(tmp_path)
    (tmp_path / "chat.jsonl").write_text("\n".join(SAMPLE[:40]) + "\n")
    (tmp_path / "notes.jsonl").write_text("".join(json.dumps({"text": f"note {i} " * 40}) + "\n" for i in range(40)))
    env = cli_env(HF_HOME=str(tmp_path / "hf_home"))
    result = run_cli(["plan", "--cluster", "cluster.toml", "--model", "org/base", "--data", "chat.jsonl"], tmp_path,
                     env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"sft-launch: error: model.path: the tokenizer in {snapshot} has no chat template, "
                                     "but the data is chat (use an instruct model's tokenizer via model.tokenizer, or "
                                     'data.format = "text")')
    text = run_cli(["plan", "--cluster", "cluster.toml", "--model", "org/base", "--data", "notes.jsonl"], tmp_path,
                   env=env)
    assert text.returncode == 0, text.stderr
    assert any(line.startswith("Data ") and "counted with abc123's tokenizer" in line for line in text.stdout.splitlines())
