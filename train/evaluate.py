"""`python -m train.evaluate`: lm-evaluation-harness and the run's held-out loss on an exported model,
results to one JSON file.

Started by `sft-launch eval` (launcher/commands/eval_cmd.py), here or inside a one-node SLURM job through
`accelerate launch`, which makes lm-eval's HF backend data parallel over the node's GPUs (each
process holds the whole model, takes a slice of the requests, rank 0 gathers and scores).
The results file holds lm-eval's results with the exact task versions, configs and n-shot, plus
the settings we ran with and the tasks a preset left out (and why). The task `heldout` is ours,
not lm-eval's: the loss, perplexity and label tokens of each source's eval split (the run's
train.toml, --train-config), computed as the training's eval computes it (train/engine/heldout.py),
under `heldout` in the file; without other tasks lm-eval is not needed.
Exit 0 ok, 2 usage, 1 failure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from contract.protocol import EVAL_HELDOUT_TASK as HELDOUT, EXIT_OK, EXIT_USAGE, is_exported_model
from contract.schema import ConfigError

INSTALL_HINT = "lm-eval is not installed: pip install 'sft-launch[eval]' (or pip install lm-eval)"
log = logging.getLogger("sft-launch.eval")
# Libraries that give their root logger a stderr handler on import yet let records propagate: each
# of their lines would be printed twice (theirs, then ours); ours is kept.
SELF_HANDLED_LOGGERS = ("huggingface_hub", "datasets")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m train.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory (the run's export)")
    parser.add_argument("--output", required=True, help="results JSON file to write")
    parser.add_argument("--tasks", required=True, help="comma-separated lm-eval tasks, groups or presets")
    parser.add_argument("--include-path", action="append", default=[], help="extra lm-eval task YAML directory")
    parser.add_argument("--limit", type=_limit, help="documents per task (< 1: a fraction)")
    parser.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each task's own)")
    parser.add_argument("--batch-size", default="auto", help="per-process batch size, or 'auto'")
    parser.add_argument("--apply-chat-template", action="store_true", help="prompt through the chat template")
    parser.add_argument("--allow-code-eval", action="store_true", help="allow tasks that execute model code")
    parser.add_argument("--seed", type=int, default=1234, help="lm-eval's random seeds")
    parser.add_argument("--name", help="name recorded in the results file (default: the file's stem)")
    parser.add_argument("--train-config", help=f"the run's train.toml (for the task {HELDOUT!r})")
    return parser


def _limit(text: str) -> int | float:
    value = float(text)
    return int(value) if value >= 1 else value


def task_manager(include_paths: list[str], requested: list[str]) -> Any:
    """lm-eval's registry. Indexing its ~10k built-in YAMLs takes tens of seconds on a slow CPU, so
    when --include-path alone defines every requested name, the built-ins are left out."""
    from lm_eval.tasks import TaskManager

    if include_paths:
        local = TaskManager(include_path=include_paths, include_defaults=False)
        if all(name in local.task_index for name in requested):
            return local
    return TaskManager(include_path=include_paths or None)


def _device() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "cpu"  # None: the HF backend picks cuda:<local rank>


def _batch_size(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def run_eval(args: argparse.Namespace, manager: Any, tasks: list[str]) -> dict[str, Any] | None:
    """simple_evaluate with the HF backend; the results on rank 0, None on the other ranks."""
    import lm_eval

    if args.allow_code_eval:
        os.environ["HF_ALLOW_CODE_EVAL"] = "1"
    checkout = Path(__file__).resolve().parents[1] / ".git"
    if checkout.exists() and "GIT_DIR" not in os.environ:
        # lm-eval records `git describe` of the working directory (the run directory, not a git
        # repository: git prints "fatal: not a git repository" to our stderr); the code that
        # evaluated is this checkout, so that is the commit to record.
        os.environ["GIT_DIR"] = str(checkout)
    return lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": args.model, "dtype": "auto"}, tasks=tasks,
        num_fewshot=args.num_fewshot, batch_size=_batch_size(args.batch_size), device=_device(),
        limit=args.limit, log_samples=False,
        apply_chat_template=args.apply_chat_template, fewshot_as_multiturn=args.apply_chat_template,
        task_manager=manager, confirm_run_unsafe_code=args.allow_code_eval, random_seed=args.seed,
        numpy_random_seed=args.seed, torch_random_seed=args.seed, fewshot_random_seed=args.seed)


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy / torch scalars
    return item() if callable(item) else str(value)


def results_record(args: argparse.Namespace, requested: list[str], selection: Any,
                   results: dict[str, Any] | None, heldout: dict[str, Any] | None) -> dict[str, Any]:
    keep = ("results", "groups", "group_subtasks", "versions", "n-shot", "higher_is_better", "n-samples",
            "configs", "config", "transformers_version", "lm_eval_version")
    settings = {"tasks_requested": requested, "tasks": [HELDOUT] * bool(heldout) + selection.tasks,
                "excluded": selection.excluded, "limit": args.limit, "num_fewshot": args.num_fewshot,
                "batch_size": args.batch_size, "apply_chat_template": args.apply_chat_template,
                "allow_code_eval": args.allow_code_eval, "seed": args.seed, "include_path": args.include_path}
    if results is not None:
        import lm_eval

        settings["lm_eval_version"] = lm_eval.__version__
    return {
        "name": args.name or Path(args.output).stem,
        "model": str(Path(args.model).resolve()),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        **({HELDOUT: heldout} if heldout else {}),
        **{key: (results or {})[key] for key in keep if key in (results or {})},
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n", encoding="utf-8")
    tmp.replace(path)


def held_out(args: argparse.Namespace) -> dict[str, Any]:
    """The `heldout` task: each source's eval loss on the model (train/engine/heldout.py)."""
    if not args.train_config:
        raise ConfigError(f"--tasks {HELDOUT}: give the run's train.toml (--train-config)")
    from contract.config import load_train_config
    from train.engine.heldout import evaluate_export

    log.info("held-out loss per source on %s (%s)", args.model, args.train_config)
    record = evaluate_export(Path(args.model), load_train_config(args.train_config))
    return {"train_config": str(Path(args.train_config).resolve()), **record}


def harness_selection(args: argparse.Namespace, requested: list[str]) -> tuple[Any, Any]:
    """(lm-eval's task manager, the selection) for the lm-eval tasks; ConfigError / TaskSelectionError: exit 2."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    for name in SELF_HANDLED_LOGGERS:  # they add a handler of their own and still propagate to ours
        logging.getLogger(name).handlers.clear()
    from train.eval_tasks import select

    manager = task_manager(args.include_path, requested)
    selection = select(manager.task_index, requested, args.allow_code_eval)
    for task, reason in selection.excluded.items():
        log.warning("leaving out %s: %s", task, reason)
    if not selection.tasks:
        raise ConfigError("--tasks: nothing left to run (every task was left out)")
    return manager, selection


def evaluate(args: argparse.Namespace, requested: list[str]) -> dict[str, Any] | None:
    """Every requested task; the results record on rank 0, None on the other ranks."""
    from train.eval_tasks import Selection, default_offline

    harness = [name for name in requested if name != HELDOUT]
    if harness and (unreachable := default_offline()):  # before datasets and huggingface_hub are imported
        log.warning("Hugging Face Hub unreachable (%s): evaluating offline (HF_HUB_OFFLINE=1), "
                    "from the HF cache only", unreachable)
    manager, selection = harness_selection(args, harness) if harness else (None, Selection(tasks=[]))
    heldout = held_out(args) if HELDOUT in requested else None
    results = None
    if selection.tasks:
        log.info("evaluating %s on %s", ", ".join(selection.tasks), args.model)
        results = run_eval(args, manager, selection.tasks)  # None on the other ranks
    if int(os.environ.get("RANK", "0")) != 0:
        return None
    return results_record(args, requested, selection, results, heldout)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="sft-launch eval: %(message)s")
    args = build_parser().parse_args(argv)
    if not is_exported_model(Path(args.model)):
        print(f"sft-launch eval: error: --model {args.model}: no config.json or adapter_config.json "
              "(not an exported model)", file=sys.stderr)
        return EXIT_USAGE
    from train.eval_tasks import TaskSelectionError

    requested = [t.strip() for t in args.tasks.split(",") if t.strip()]
    try:
        record = evaluate(args, requested)
    except (ConfigError, TaskSelectionError) as err:
        print(f"sft-launch eval: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    if record is not None:  # rank 0
        write_json(Path(args.output), record)
        log.info("results: %s", args.output)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
