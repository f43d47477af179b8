"""A corpus of realistic mistakes, each caught on the login node before anything waits in a queue.

Every case runs the real CLI (no --dry-run, so a mistake that slipped through would reach the stub
`sbatch`, which records every call) and must: exit 2, say so in at most 3 lines that name the
offending flag, key or file(:line), write no run directory and never call sbatch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.launcher.conftest import REPO, cli_env, path_without, run_cli, write_stub

SAMPLE = (REPO / "train" / "assets" / "sample_chat.jsonl").read_text().splitlines()
TOKENIZER = REPO / "train" / "assets" / "tiny-tokenizer"
CLUSTER = """default_profile = "cpu"
[profiles.cpu]
partition = "cpu"
exclusive = false
gpus_per_node = 0
processes_per_node = 1
backend = "gloo"
time = "1:00:00"
signal_lead_s = 60
storage_root = "runs"
"""
CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 512,
          "max_position_embeddings": 512, "tie_word_embeddings": False}


def _chat(*turns: tuple[str, str], key: str = "conversations", role: str = "from", text: str = "value") -> str:
    return json.dumps({key: [{role: r, text: t} for r, t in turns]})


def _rows(bad: str, at: int = 7) -> str:
    """Six good rows, the bad one on line `at`, two more good rows."""
    lines = SAMPLE[: at - 1] + [bad] + SAMPLE[at - 1: at + 1]
    return "\n".join(lines) + "\n"


def _model_dir(root: Path, name: str, tokenizer: bool = True, template: bool = True,
               config: dict | None = None) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config or CONFIG))
    if tokenizer:
        (directory / "tokenizer.json").write_bytes((TOKENIZER / "tokenizer.json").read_bytes())
        (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    if template:
        (directory / "chat_template.jinja").write_bytes((TOKENIZER / "chat_template.jinja").read_bytes())
    return directory


def _files(root: Path) -> None:
    """Every file the cases point at (bad data, broken model directories, a cluster file)."""
    data = {
        "invalid_json.jsonl": _rows('{"conversations": [{"from": "human", "value": "hi"}'),
        "wizard.jsonl": _rows(_chat(("human", "hi"), ("wizard", "abracadabra"))),
        "no_assistant.jsonl": _rows(_chat(("human", "hi"), ("human", "anyone?"))),
        "empty_reply.jsonl": _rows(_chat(("human", "hi"), ("gpt", "  "))),
        "late_system.jsonl": _rows(_chat(("human", "hi"), ("system", "be nice"), ("gpt", "ok"))),
        "no_value.jsonl": _rows(json.dumps({"conversations": [{"from": "human"}, {"from": "gpt", "value": "x"}]})),
        "empty_turns.jsonl": _rows(json.dumps({"conversations": []})),
        "not_object.jsonl": _rows('["human", "hi"]'),
        "number_value.jsonl": _rows(json.dumps({"conversations": [{"from": "human", "value": 42},
                                                                    {"from": "gpt", "value": "x"}]})),
        "surrogate.jsonl": _rows('{"conversations": [{"from": "human", "value": "\\ud800"}, '
                                 '{"from": "gpt", "value": "x"}]}'),
        "messages_role.jsonl": "\n".join([_chat(("user", "hi"), ("assistant", "yo"), key="messages", role="role",
                                                text="content")] * 3
                                         + [_chat(("user", "hi"), ("bot", "yo"), key="messages", role="role",
                                                  text="content")]) + "\n",
        "alpaca_no_output.jsonl": json.dumps({"instruction": "a", "output": "b"}) + "\n"
                                  + json.dumps({"instruction": "c", "answer": "d"}) + "\n",
        "tokens_negative.jsonl": json.dumps({"input_ids": [1, 2, 3]}) + "\n" + json.dumps({"input_ids": [1, -5]}) + "\n",
        "tokens_labels.jsonl": json.dumps({"input_ids": [1, 2, 3], "labels": [1, 2]}) + "\n",
        "unknown_format.jsonl": json.dumps({"question": "a", "reply": "b"}) + "\n",
        "all_bad.jsonl": "{oops\n{nope\n",
        "empty.jsonl": "",
        "array_bad.json": "[\n" + SAMPLE[0] + ",\n{broken\n]\n",
        "data.tsv": "prompt\tcompletion\na\tb\n",
        "mixed_formats.jsonl": SAMPLE[0] + "\n" + _chat(("user", "hi"), ("assistant", "yo"), key="messages",
                                                         role="role", text="content") + "\n",
    }
    for name, text in data.items():
        (root / name).write_text(text, encoding="utf-8")
    (root / "bad_utf8.jsonl").write_bytes(("\n".join(SAMPLE[:3]) + "\n").encode() + b'{"x": "\xff\xfe"}\n')
    (root / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (root / "good.jsonl").write_text("\n".join(SAMPLE[:20]) + "\n")
    (root / "afile").write_text("not a directory\n")
    (root / "project").mkdir()  # someone's own folder: a launch must not write (or remove) files there
    (root / "project" / "accelerate.yaml").write_text("compute_environment: LOCAL_MACHINE\n")
    (root / "text.jsonl").write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    _columnar(root, [json.loads(line) for line in SAMPLE[:6]] + [json.loads(_chat(("human", "hi"), ("bot", "x")))])
    (root / "noconfig").mkdir()
    _model_dir(root, "notokenizer", tokenizer=False)
    _model_dir(root, "basemodel", template=False)
    _model_dir(root, "gptoss", config={**CONFIG, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                                       "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]})
    (_model_dir(root, "strict-template", template=False) / "chat_template.jinja").write_text(
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    (_model_dir(root, "corrupt-tokenizer") / "tokenizer.json").write_text("{ truncated")
    (root / "cluster.toml").write_text(CLUSTER)
    (root / "broken.toml").write_text('default_profile = "cpu"\n[profiles.cpu]\ngpus_per_node = \n')
    (root / "typo.toml").write_text(CLUSTER + "partiton = \"x\"\n")
    # saved by an editor in Latin-1: an accented comment
    (root / "latin1.toml").write_bytes(b"# cluster profiles\n# caf\xe9\n" + CLUSTER.encode())
    (root / "latin1_mix.toml").write_bytes(b'[[data.sources]]\n# caf\xe9\npath = "good.jsonl"\n')
    (root / "hf_home").mkdir()
    (root / "shared.toml").write_text(CLUSTER + f'shared_paths = ["{root / "hf_home"}"]\n')
    (root / "hfhome.toml").write_text(CLUSTER + f'hf_home = "{root / "hf_home"}"\n')
    _mixtures(root)
    (root / "apptainer.toml").write_text(CLUSTER + '[profiles.cpu.container]\nkind = "apptainer"\n'
                                         'image = "/nonexistent/images/sft.sif"\n')


def _mixtures(root: Path) -> None:
    """Data files with [[data.sources]] (train.toml's [data] table) and a fake HF cache with one dataset."""
    import datasets

    from tests.hub_fixture import build_hub_cache

    qa = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(900)]
    del qa[811]["question"]
    (root / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in qa))
    chats = [json.loads(line) for line in SAMPLE[:6]]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(chats)}).save_to_disk(str(root / "saved_dict"))
    build_hub_cache(root / "hf_home", "sft-test/tiny_qa", {"train": qa[:5], "test": qa[5:7]})
    qa_source = '[[data.sources]]\npath = "{path}"\nformat = "prompt_completion"\n' \
                'columns = {{prompt = "question", completion = "answer"}}\n{extra}'
    toml = {
        "mapped_column.toml": qa_source.format(path="qa.jsonl", extra=""),
        "no_split.toml": '[[data.sources]]\npath = "saved_dict"\nsplit = "validation"\n',
        "hub_no_split.toml": qa_source.format(path="sft-test/tiny_qa", extra='split = "validation"\n'),
        "same_name.toml": '[[data.sources]]\npath = "good.jsonl"\nname = "chat"\n'
                          '[[data.sources]]\npath = "text.jsonl"\nname = "chat"\n',
        "zero_weight.toml": '[[data.sources]]\npath = "good.jsonl"\nweight = 0\n',
        "missing_source.toml": '[[data.sources]]\npath = "good.jsonl"\n\n[[data.sources]]\nname = "more"\n'
                               'path = "nope.jsonl"\n',
        "tool_calls.toml": '[[data.sources]]\npath = "tools.jsonl"\nformat = "messages"\n',
        # a file names no split: its eval_split (and a split other than train) cannot be honoured
        "file_eval_split.toml": '[[data.sources]]\npath = "good.jsonl"\neval_split = "validation"\n',
        "folder_split.toml": '[[data.sources]]\npath = "sft_folder"\nsplit = "train_sft"\neval_split = "dev"\n',
        "eval_is_train.toml": '[[data.sources]]\npath = "good.jsonl"\neval_path = "good.jsonl"\n',
    }
    (root / "sft_folder").mkdir()
    for split in ("train_sft", "test_sft"):
        (root / "sft_folder" / f"{split}-00000-of-00001.jsonl").write_text("\n".join(SAMPLE[:3]) + "\n")
    for name, text in toml.items():
        (root / name).write_text(text)
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Lima"}'}}]}
    tools = {"messages": [{"role": "user", "content": "Weather in Lima?"}, call,
                          {"role": "tool", "content": "22 C, sunny"}, {"role": "assistant", "content": "Sunny, 22 C."}]}
    (root / "tools.jsonl").write_text(json.dumps(tools) + "\n")


def _columnar(root: Path, rows: list[dict]) -> None:
    """The same rows as Parquet and as a saved `datasets` directory (row 6 has an unknown role)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"conversations": row["conversations"]} for row in rows]
    pq.write_table(pa.Table.from_pylist(rows), root / "bad.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "saved"))


D = ["--model", "tiny", "--data"]  # most data cases
# (case id, arguments, text the message must contain)
MISTAKES: list[tuple[str, list[str], str]] = [
    # --- datasets: every row checked with the training side's own parser ---
    ("invalid-json", [*D, "invalid_json.jsonl"], "invalid_json.jsonl:7: invalid JSON"),
    ("unknown-role", [*D, "wizard.jsonl"], "wizard.jsonl:7: conversations[1]: unknown role 'wizard'"),
    ("binary-garbage", [*D, "binary.jsonl"], "binary.jsonl:1: binary data"),
    ("no-assistant-turn", [*D, "no_assistant.jsonl"], "no_assistant.jsonl:7: no assistant turn"),
    ("empty-reply", [*D, "empty_reply.jsonl"], "empty_reply.jsonl:7: field 'value' is empty"),
    ("system-not-first", [*D, "late_system.jsonl"], "late_system.jsonl:7: a system turn may only come first"),
    ("turn-without-value", [*D, "no_value.jsonl"], "no_value.jsonl:7: conversations[0] needs 'from' and 'value'"),
    ("empty-conversation", [*D, "empty_turns.jsonl"], "empty_turns.jsonl:7: field 'conversations' must be"),
    ("row-not-object", [*D, "not_object.jsonl"], "not_object.jsonl:7: expected a JSON object"),
    ("value-not-string", [*D, "number_value.jsonl"], "number_value.jsonl:7: field 'value' must be a string"),
    ("lone-surrogate", [*D, "surrogate.jsonl"], "surrogate.jsonl:7: field 'value' is not valid UTF-8"),
    ("bad-utf8", [*D, "bad_utf8.jsonl"], "bad_utf8.jsonl:4: not valid UTF-8"),
    ("messages-unknown-role", [*D, "messages_role.jsonl"], "messages_role.jsonl:4: messages[1]: unknown role 'bot'"),
    ("alpaca-missing-output", [*D, "alpaca_no_output.jsonl"], "alpaca_no_output.jsonl:2: missing field 'output'"),
    ("tokens-negative-id", [*D, "tokens_negative.jsonl"], "tokens_negative.jsonl:2: field 'input_ids'"),
    ("tokens-label-count", [*D, "tokens_labels.jsonl"], "tokens_labels.jsonl:1: field 'labels'"),
    ("unknown-format", [*D, "unknown_format.jsonl"], "unknown_format.jsonl:1: cannot detect data.format"),
    ("every-row-bad", [*D, "all_bad.jsonl", "--set", "data.allow_bad_rows=true"], "all_bad.jsonl:1: invalid JSON"),
    ("empty-file", [*D, "empty.jsonl"], "empty.jsonl: no rows"),
    ("json-array-syntax", [*D, "array_bad.json"], "array_bad.json:3: invalid JSON"),
    ("tsv-file", [*D, "data.tsv"], "data.tsv: unsupported data file"),
    ("mixed-formats", [*D, "mixed_formats.jsonl"], "mixed_formats.jsonl:2: field 'conversations'"),
    ("text-field-missing", [*D, "text.jsonl", "--set", "data.format=text"], "text.jsonl:2: missing field 'text'"),
    ("wrong-format-forced", [*D, "good.jsonl", "--set", "data.format=alpaca"], "good.jsonl:1: missing field"),
    ("parquet-bad-row", [*D, "bad.parquet"], "bad.parquet[row 7]: conversations[1]: unknown role 'bot'"),  # 1-based
    ("saved-dataset-bad-row", [*D, "saved"], "saved[row 7]: conversations[1]: unknown role 'bot'"),
    ("missing-data-file", [*D, "nope.jsonl"], "--data nope.jsonl: no such file"),
    ("hub-dataset-not-cached", [*D, "someorg/some-dataset", "--cluster", "hfhome.toml"],
     "--data someorg/some-dataset: not in the HF datasets cache ("),
    # --- several sources ([[data.sources]], repeated --data) ---
    ("weight-zero", [*D, "good.jsonl", "--data", "text.jsonl:0"], "--data text.jsonl:0: weight must be > 0"),
    ("weight-negative", [*D, "good.jsonl:-0.5"], "--data good.jsonl:-0.5: weight must be > 0"),
    ("weight-zero-toml", [*D, "zero_weight.toml"], "zero_weight.toml:3: data.sources[0].weight: must be > 0, got 0"),
    ("source-missing-toml", [*D, "missing_source.toml"],
     "missing_source.toml:6: data.sources[1].path nope.jsonl: no such file"),
    ("mapped-column-missing", [*D, "mapped_column.toml"], "qa.jsonl:812: missing field 'question'"),
    ("split-missing-saved", [*D, "no_split.toml"], "no_split.toml:3: data.sources[0].split: "
     "{WORKDIR}/saved_dict: no split 'validation' (has train)"),
    ("split-missing-hub", [*D, "hub_no_split.toml", "--cluster", "hfhome.toml"],
     'hub_no_split.toml:5: data.sources[0].split sft-test/tiny_qa: Unknown split "validation"'),
    ("eval-split-of-a-file", [*D, "file_eval_split.toml"], "file_eval_split.toml:3: data.sources[0].eval_split: "
     "the files beside {WORKDIR}/good.jsonl: no split 'validation' (no file names a split, as "
     "validation-00000-of-00001.jsonl, validation.jsonl or a validation/ folder would); or use eval_path / eval_fraction"),
    ("eval-split-of-a-folder", [*D, "folder_split.toml"], "folder_split.toml:4: data.sources[0].eval_split: "
     "{WORKDIR}/sft_folder: no split 'dev' (has test_sft, train_sft)"),
    ("eval-path-is-the-data", [*D, "eval_is_train.toml"], "eval_is_train.toml:3: data.sources[0].eval_path: is the "
     "training data itself"),
    ("source-names-clash", [*D, "same_name.toml"],
     "same_name.toml:6: data.sources[1].name: 'chat' is also the name of data.sources[0]"),
    ("template-without-tools", [*D, "tool_calls.toml"], "tools.jsonl:1: the chat template leaves out messages[1]: tool call 'get_weather'"),
    ("missing-eval-file", [*D, "good.jsonl", "--set", "data.eval_path=missing.jsonl"],
     "data.eval_path missing.jsonl: no such file"),
    ("bad-eval-row", [*D, "good.jsonl", "--set", "data.eval_path=wizard.jsonl"], "wizard.jsonl:7: conversations[1]"),
    ("bad-data-format-value", [*D, "good.jsonl", "--set", "data.format=chatml"], "data.format"),
    ("eval-fraction-range", [*D, "good.jsonl", "--set", "data.eval_fraction=1.5"], "data.eval_fraction"),
    # --- models ---
    ("model-typo", ["--model", "llama3-8bb"], "did you mean: llama3-8b"),
    ("model-dir-no-config", ["--model", "noconfig"], "--model noconfig: directory has no config.json"),
    ("model-dir-no-tokenizer", ["--model", "notokenizer"], "has no tokenizer"),
    ("base-model-chat-data", ["--model", "basemodel"], "has no chat template"),
    ("template-cannot-mask", ["--model", "strict-template"], "roles must alternate"),
    ("tokenizer-corrupt", ["--model", "corrupt-tokenizer"], "cannot load the tokenizer"),
    ("tokenizer-dir-missing", ["--model", "tiny", "--set", "model.tokenizer=/nonexistent/tok"],
     "model.tokenizer: /nonexistent/tok: no such directory"),
    ("hf-id-not-cached", ["--model", "someorg/some-model"], "--model someorg/some-model: not a preset"),
    ("hub-model-not-in-hf-home", ["--model", "llama3-8b", "--cluster", "hfhome.toml"],
     "model.path meta-llama/Meta-Llama-3-8B: not in profile.hf_home's cache"),
    ("flash-attn-on-cpu", ["--model", "tiny", "--set", "model.attn_implementation=flash_attn"],
     "model.attn_implementation: flash_attn needs GPUs"),
    ("sinks-on-a-backend-without-them", ["--model", "gptoss", "--set", "profile.gpus_per_node=1", "--set",
                                         "model.attn_implementation=flash_attn"],
     "model.attn_implementation: flash_attn cannot compute the model's attention sinks (sliding_attention, "
     "full_attention layers); use fa4, sdpa"),
    ("sharded-init-with-model-path", ["--model", "basemodel", "--set", "model.init=sharded"],
     "model.init: 'sharded' draws random weights; it cannot be combined with model.path"),
    ("sharded-init-with-qlora", ["--model", "tiny", "--qlora", "--set", "model.init=sharded"],
     "model.init: 'sharded' is not for QLoRA"),
    ("sharded-init-with-deepspeed", ["--model", "tiny", "--strategy", "zero3", "--set", "profile.gpus_per_node=8",
                                     "--set", "profile.processes_per_node=8", "--set", "model.init=sharded"],
     "model.init: 'sharded' needs --strategy fsdp"),
    ("arch-key-typo", ["--model", "tiny", "--set", "model.arch.hiden_size=128"],  # silently ignored by HF
     "model.arch.hiden_size: unknown key (did you mean: hidden_size?)"),
    ("lora-dropout-above-1", ["--model", "tiny", "--lora", "--set", "lora.dropout=1.5"],  # torch's Dropout refuses it
     "lora.dropout: must be in [0, 1)"),
    ("lora-no-target-modules", ["--model", "tiny", "--lora", "--set", "lora.target_modules=[]"],
     "lora.target_modules: name at least one"),
    ("lora-unknown-target-module", ["--model", "tiny", "--lora", "--set", 'lora.target_modules=["q_proj", "qkv"]'],
     "lora.target_modules: unknown module 'qkv'"),
    ("lora-alpha-negative", ["--model", "tiny", "--lora", "--set", "lora.alpha=-16"], "lora.alpha: must be > 0"),
    ("model-init-typo", ["--model", "tiny", "--set", "model.init=shard"], "model.init"),
    # --- command line ---
    ("nodes-zero", ["--model", "tiny", "--nodes", "0"], "--nodes 0: must be >= 1"),
    ("time-malformed", ["--model", "tiny", "--time", "1:2:3:4"], "--time: bad time limit"),
    ("time-below-signal-lead", ["--model", "tiny", "--time", "1"], "--time 0-00:01:00: shorter than"),
    ("deepspeed-on-cpu", ["--model", "tiny", "--strategy", "zero3"], "--strategy zero3: DeepSpeed needs GPUs"),
    ("fsdp1-cpu-offload", ["--model", "tiny", "--strategy", "fsdp1", "--set", "profile.gpus_per_node=8", "--set",
                           "profile.processes_per_node=8", "--set", "profile.cpu_offload=true"],
     "profile.cpu_offload: FSDP1 with CPU offload does not restore the weights on resume"),
    ("learning-rate-not-number", ["--model", "tiny", "--learning_rate", "abc"], "train.learning_rate: expected float"),
    ("max-steps-zero", ["--model", "tiny", "--max_steps", "0"], "train.max_steps: must be -1 or > 0"),
    # values torch or the loop would refuse (or act on wrongly) only once the job runs
    ("adam-beta-1", ["--model", "tiny", "--adam_beta1", "1.0"], "train.adam_beta1: must be in [0, 1)"),
    ("adam-beta-negative", ["--model", "tiny", "--adam_beta2", "-0.1"], "train.adam_beta2: must be in [0, 1)"),
    ("weight-decay-negative", ["--model", "tiny", "--weight_decay", "-1"], "train.weight_decay: must be >= 0"),
    ("grad-norm-negative", ["--model", "tiny", "--max_grad_norm", "-1"], "train.max_grad_norm: must be >= 0"),
    ("seed-negative", ["--model", "tiny", "--seed", "-1"], "train.seed: must be in [0, 2**32)"),
    ("eval-steps-negative", ["--model", "tiny", "--eval_steps", "-1"], "train.eval_steps: must be >= 0"),
    ("profile-steps-backwards", ["--model", "tiny", "--profile_steps", "10:5"], "train.profile_steps: STOP must"),
    ("num-workers-negative", ["--model", "tiny", "--set", "data.num_workers=-1"], "data.num_workers: must be >= 0"),
    ("unknown-reporter", ["--model", "tiny", "--set", 'train.report_to=["tensorboard"]'], "train.report_to"),
    ("set-without-value", ["--model", "tiny", "--set", "train.learning_rate"], "--set train.learning_rate: expected"),
    ("set-unknown-namespace", ["--model", "tiny", "--set", "bogus.x=1"], "--set bogus.x: unknown key"),
    ("set-train-typo", ["--model", "tiny", "--set", "train.lerning_rate=1"], "did you mean: learning_rate"),
    ("local-executor-two-nodes", ["--model", "tiny", "--executor", "local", "--nodes", "2"], "--nodes: the local"),
    ("output-under-a-file", ["--model", "tiny", "--output", "afile/run"], "afile is not writable"),
    ("output-is-a-file", ["--model", "tiny", "--output", "afile"], "exists and is not a directory"),
    ("data-empty", ["--model", "tiny", "--data", ""], "argument --data: empty value"),  # --data "$UNSET"
    ("model-empty", ["--model", ""], "argument --model: empty value"),
    ("cluster-empty", ["--model", "tiny", "--cluster", ""], "argument --cluster: empty value"),
    ("status-run-empty", ["status", ""], "argument RUN: empty value"),  # not the working directory's run
    ("output-empty", ["--model", "tiny", "--output", ""], "argument --output: empty value"),
    ("output-is-a-project-folder", ["--model", "tiny", "--output", "project"], "project: not a run directory"),
    ("output-is-the-working-dir", ["--model", "tiny", "--output", "."], "not a run directory (no run.json"),
    # --- flags and commands, spelled almost right (no argparse abbreviations, a hint instead) ---
    ("flag-abbreviated", ["--model", "tiny", "--max_step", "20"], "unknown flag --max_step; did you mean --max_steps?"),
    ("flag-with-dashes", ["--model", "tiny", "--max-steps", "20"], "unknown flag --max-steps; did you mean --max_steps?"),
    ("flag-dashes-lr", ["--model", "tiny", "--learning-rate=1e-5"], "did you mean --learning_rate?"),
    ("launcher-flag-abbreviated", ["--model", "tiny", "--node", "2"], "unknown flag --node; did you mean --nodes?"),
    ("launcher-flag-underscore", ["--model", "tiny", "--dry_run"], "unknown flag --dry_run; did you mean --dry-run?"),
    ("flag-unknown", ["--model", "tiny", "--turbo"], "unknown flag --turbo; try 'sft-launch --help'"),
    ("stray-argument", ["--model", "tiny", "extra"], "unrecognized arguments: extra"),
    ("executor-typo", ["--model", "tiny", "--executor", "lcoal"], "argument --executor: invalid choice: 'lcoal'"),
    ("command-typo", ["stauts", "myrun"], "unknown command 'stauts' (did you mean: status?)"),
    ("command-unknown", ["train", "--model", "tiny"], "unknown command 'train'; commands: models, status"),
    ("plan-flag-abbreviated", ["plan", "--model", "tiny", "--max_step", "3"],
     "unknown flag --max_step; did you mean --max_steps? (try 'sft-launch plan --help')"),
    ("status-flag-typo", ["status", "somerun", "--jsn"], "unknown flag --jsn; did you mean --json?"),
    ("cancel-flag-abbreviated", ["cancel", "somerun", "--no"], "unknown flag --no; did you mean --now?"),
    # --- cluster profiles ---
    ("profile-unknown", ["--model", "tiny", "--profile", "gpu"], "gpu"),
    ("cluster-file-missing", ["--model", "tiny", "--cluster", "missing.toml"], "missing.toml"),
    ("cluster-toml-syntax", ["--model", "tiny", "--cluster", "broken.toml"], "broken.toml"),
    ("cluster-file-not-utf8", ["--model", "tiny", "--cluster", "latin1.toml"], "latin1.toml:2: not valid UTF-8"),
    ("data-toml-not-utf8", [*D, "latin1_mix.toml"], "latin1_mix.toml:2: not valid UTF-8"),
    ("profile-key-typo", ["--model", "tiny", "--cluster", "typo.toml"], "partiton"),
    ("profile-negative-gpus", ["--model", "tiny", "--set", "profile.gpus_per_node=-1"], "gpus_per_node: must be >= 0"),
    ("profile-python-empty", ["--model", "tiny", "--set", "profile.python="], "python: must name the interpreter"),
    ("profile-storage-root-empty", ["--model", "tiny", "--set", "profile.storage_root="], "storage_root: must name"),
    ("profile-secret-env", ["--model", "tiny", "--set", "profile.env.HF_TOKEN=abc"], "export it in your shell"),
    ("data-not-on-shared-storage", [*D, "good.jsonl", "--cluster", "shared.toml"],
     "good.jsonl: not on the nodes' shared storage (profile.shared_paths"),
    ("container-image-missing", ["--model", "tiny", "--cluster", "apptainer.toml"],
     "container.image: /nonexistent/images/sft.sif: no such file"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mistakes")
    _files(root)
    return root


def test_the_corpus_is_large() -> None:
    assert len(MISTAKES) >= 45 and len({name for name, _, _ in MISTAKES}) == len(MISTAKES)


@pytest.mark.parametrize(("args", "expected"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_mistake_stops_before_the_queue(workdir: Path, tmp_path: Path, args: list[str], expected: str) -> None:
    calls = tmp_path / "sbatch-calls"
    bin_dir = tmp_path / "bin"
    write_stub(bin_dir, "sbatch", f'echo "$*" >> {str(calls)!r}\necho 4242\n')
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{path_without('sbatch')}")
    cluster = [] if "--cluster" in args else ["--cluster", "cluster.toml"]
    output = [] if "--output" in args else ["--output", str(tmp_path / "run")]
    before = sorted(p.name for p in workdir.iterdir())
    result = run_cli([*args, *cluster, *output], workdir, env=env)  # flags last: a command comes first
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert 1 <= len(lines) <= 3 and lines[-1].startswith("sft-launch: error: "), result.stderr
    assert expected.replace("{WORKDIR}", str(workdir.resolve())) in result.stderr, result.stderr
    assert not (tmp_path / "run").exists() and not (workdir / "runs").exists(), "a run directory was written"
    assert sorted(p.name for p in workdir.iterdir()) == before, "files appeared next to the data"
    assert not calls.exists(), f"sbatch was called: {calls.read_text()}"


@pytest.mark.parametrize(("change", "expected"), [
    (["--model", "chatmodel"], "model.path = ''"),
    (["--model", "tiny", "--lora"], "lora.enabled = False"),
    (["--model", "tiny", "--set", "model.arch.hidden_size=128"], "model.arch.hidden_size = 64"),
], ids=["other-model", "lora-now", "other-arch"])
def test_relaunch_into_a_run_whose_checkpoints_it_cannot_load(workdir: Path, tmp_path: Path, change: list[str],
                                                              expected: str) -> None:
    """--output naming a run that has a complete checkpoint resumes from it; a launch whose weights differ
    (another model or architecture, LoRA switched on) would fail loading it on the nodes, after the queue.
    Refused in one line (exit 2) naming the key, the run's train.toml left as it was, sbatch not called."""
    calls, bin_dir, run_dir = tmp_path / "sbatch-calls", tmp_path / "bin", tmp_path / "run"
    change = [str(_model_dir(tmp_path, word)) if word == "chatmodel" else word for word in change]
    write_stub(bin_dir, "sbatch", f'echo "$*" >> {str(calls)!r}\necho 4242\n')
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{path_without('sbatch')}")
    first = run_cli(["--model", "tiny", "--cluster", "cluster.toml", "--output", str(run_dir)], workdir, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoint = run_dir / "checkpoints" / "step-00000010"
    checkpoint.mkdir(parents=True)
    (checkpoint / "COMPLETE").touch()  # what the job left behind
    rendered = (run_dir / "train.toml").read_text()
    calls.unlink()
    result = run_cli([*change, "--cluster", "cluster.toml", "--output", str(run_dir)], workdir, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and expected in lines[0] and "--output" in lines[0], result.stderr
    assert (run_dir / "train.toml").read_text() == rendered
    assert not calls.exists(), f"sbatch was called: {calls.read_text()}"
    same = run_cli(["--model", "tiny", "--learning_rate", "1e-4", "--cluster", "cluster.toml", "--output",
                    str(run_dir)], workdir, env=env)  # the same weights, another learning rate: resumes
    assert same.returncode == 0, same.stdout + same.stderr


@pytest.mark.parametrize("dry_run", [False, True], ids=["launch", "dry-run"])
def test_relaunch_into_a_run_whose_run_json_is_broken(workdir: Path, tmp_path: Path, dry_run: bool) -> None:
    """A run.json cut short (a full disk, an editor): one line naming run.json:LINE (exit 2), not a
    JSONDecodeError traceback; nothing rewritten, sbatch not called."""
    calls, bin_dir, run_dir = tmp_path / "sbatch-calls", tmp_path / "bin", tmp_path / "run"
    write_stub(bin_dir, "sbatch", f'echo "$*" >> {str(calls)!r}\necho 4242\n')
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{path_without('sbatch')}")
    run_dir.mkdir()
    (run_dir / "run.json").write_text('{"job_ids": ["17",\n')
    result = run_cli(["--model", "tiny", "--cluster", "cluster.toml", "--output", str(run_dir),
                      *(["--dry-run"] if dry_run else [])], workdir, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and f"{run_dir / 'run.json'}:2: not valid JSON" in lines[0], result.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"] and not calls.exists()
