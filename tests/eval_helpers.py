"""Shared by the eval/chat tests: custom lm-eval tasks on a local JSONL, and a run with a tiny export.

The tasks (a multiple-choice one and a generation one) are written per test with the JSONL's
absolute path in `data_files`, so lm-eval loads them through `datasets`' json builder, offline.
The run directory is rendered as a launch renders it (`sft-launch --executor local --model tiny`,
without starting it: tests/launcher/conftest.write_run); its export is a random tiny Llama saved the way train/engine/export.py saves one (weights,
config, generation config, the shipped tiny tokenizer with its chat template).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADDITIONS = [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)]

MC_TASK = """\
task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
GEN_TASK = """\
task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files: {{test: {data}}}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 2.0
"""
UNSAFE_TASK = GEN_TASK.replace("task: tiny_gen", "task: tiny_code").replace("output_type:", "unsafe_code: true\noutput_type:")


def write_tasks(directory: Path) -> Path:
    """tiny_mc / tiny_gen / tiny_code (unsafe_code) YAMLs and their JSONL in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "additions.jsonl"
    rows = [{"question": f"What is {a} plus {b}?", "choices": [str(a + b), str(a + b + 1), str(a * b + 3)],
             "label": 0, "answer": str(a + b)} for a, b in ADDITIONS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    for name, text in (("tiny_mc", MC_TASK), ("tiny_gen", GEN_TASK), ("tiny_code", UNSAFE_TASK)):
        (directory / f"{name}.yaml").write_text(text.format(data=json.dumps(str(data))), encoding="utf-8")
    return directory


def offline_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The repo importable; no hub; datasets' cache inside the test's tmp dir; 1 thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")])),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"),
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **extra)
    return env


def save_tiny_export(export: Path) -> Path:
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from tests.train.conftest import TINY_ARCH, TINY_TOKENIZER_DIR

    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR, local_files_only=True)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH, **ids))
    model.generation_config = GenerationConfig(**ids)
    model.save_pretrained(export)
    tokenizer.save_pretrained(export)
    return export


def make_run(root: Path, name: str = "run") -> Path:
    """A run directory rendered as a local launch renders it, with a tiny export in it."""
    from tests.launcher.conftest import write_run

    run_dir = write_run(["--executor", "local", "--model", "tiny", "--output", str(root / name)])
    save_tiny_export(run_dir / "export")
    return run_dir


def sft_launch(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300,
               stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout, check=False)
