"""The launch command line: flags -> `LaunchRequest`. Shared by `sft-launch` and `sft-launch plan`.

Training flags are generated from `TrainSection` (contract/config.py): one flag per field, its
--help line the field's documentation.
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from contract import __version__
from contract.config import TrainSection
from contract.schema import field_help, field_type, parse_for
from contract.strategies import LAUNCHABLE
from launcher.cli import COMMANDS
from launcher.execute.executors import EXECUTORS
from launcher.resolve.options import LaunchRequest, train_flag_names
from launcher.usage import Parser, given

EPILOG = """\
Training flags (--learning_rate ... --profile_steps) are train.toml's [train] keys, named as in
transformers' TrainingArguments. --set KEY=VALUE overrides any key by its dotted name:
profile.<key> (cluster profile) or model./data./train./lora./run.<key> (train.toml); values are
TOML literals (1e-5, true, ["wandb"]) or plain strings. Every launch prints the plan (memory, time,
signal lead) and refuses one that does not fit unless --force. `sft-launch plan` takes the same
flags (but the launch-only --dry-run, --force, --job-name) and writes nothing. Other commands
(sft-launch COMMAND --help): {commands}.
"""


def build_parser(launch: bool = True) -> argparse.ArgumentParser:
    """The launch's flags; `launch` False (`sft-launch plan`) leaves out those that act on a launch only."""
    parser = Parser(
        prog="sft-launch", description="Fine-tune a LLaMA-family model on SLURM (or locally): "
        "validate, render a run directory, submit.", epilog=EPILOG.format(commands=", ".join(COMMANDS)),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sft-launch {__version__}")
    parser.add_argument("--cluster", type=given, metavar="FILE", help="cluster profiles (default ./cluster.toml)")
    parser.add_argument("--profile", type=given, metavar="NAME",
                        help="profile in the cluster file (default: default_profile)")
    parser.add_argument("--nodes", type=int, default=1, metavar="N", help="number of nodes (default 1)")
    parser.add_argument("--model", required=True, type=given, metavar="M",
                        help="preset (sft-launch models), local dir or HF id")
    parser.add_argument("--data", type=given, metavar="PATH[:WEIGHT]", action="append",
                        help="training data: a JSONL/JSON/Parquet/CSV file, a folder of them, a saved datasets "
                             "folder or a hub dataset id in the HF cache; repeat to mix sources (WEIGHT: passes "
                             "per epoch, default 1), or a .toml file with [[data.sources]] (default: the "
                             "shipped sample chat set)")
    parser.add_argument("--output", type=given, metavar="DIR",
                        help="run directory (default: <storage_root>/<profile>-<model>-<hash>)")
    parser.add_argument("--strategy", choices=LAUNCHABLE, help="sharding (default: the profile's, else fsdp = FSDP2)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    parser.add_argument("--qlora", action="store_true",
                        help="QLoRA: --lora over a frozen base quantized to 4-bit NF4 (= --lora --set lora.quant=nf4)")
    parser.add_argument("--context_parallel", type=int, metavar="N",
                        help="split each packed sequence over N GPUs (parallel.context; Ulysses all-to-all over "
                             "attention heads): documents longer than one GPU holds, trained whole")
    parser.add_argument("--expert_parallel", type=int, metavar="N",
                        help="split each mixture-of-experts layer's experts over N GPUs (parallel.expert; N divides "
                             "the GPUs and the experts): tokens go to their experts by all-to-all")
    parser.add_argument("--time", type=given, metavar="D-HH:MM:SS", help="time limit (default: the profile's)")
    parser.add_argument("--executor", choices=tuple(EXECUTORS), default="sbatch",
                        help="sbatch (default), local: run here without SLURM, or submitit: through submitit")
    if launch:
        parser.add_argument("--job-name", type=given, metavar="NAME",
                            help="SLURM job name (default: sft-<run dir name>)")
        parser.add_argument("--dry-run", action="store_true", help="render and check, submit nothing")
        parser.add_argument("--force", action="store_true",
                            help="launch even when the plan says it does not fit in memory or on disk")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="override a profile or training key (repeatable)")
    group = parser.add_argument_group("training flags ([train] in train.toml)")
    hints = typing.get_type_hints(TrainSection)
    for name in train_flag_names():
        # Every flag takes a TOML literal; bools may be given bare (--gradient_checkpointing).
        kind = hints[name]
        extra: dict[str, Any] = {"nargs": "?", "const": "true"} if kind is bool else {}
        if typing.get_origin(kind) is list:
            extra = {"nargs": "+"}
        # argparse expands %-formats in help texts: a description may say "1.4%" as it is
        help_text = field_help(TrainSection, name).replace("%", "%%")
        group.add_argument(f"--{name}", dest=f"train__{name}", metavar="V", help=help_text, **extra)
    return parser


def request_from_args(args: argparse.Namespace) -> LaunchRequest:
    flags = {}
    for key, value in vars(args).items():
        if key.startswith("train__") and value is not None:
            name = key.removeprefix("train__")
            flags[name] = [str(v) for v in value] if isinstance(value, list) else \
                parse_for(value, field_type(TrainSection, name))
    return LaunchRequest(
        model=args.model, nodes=args.nodes, cluster=args.cluster, profile=args.profile, data=args.data,
        output=args.output, strategy=args.strategy, lora=args.lora, qlora=args.qlora, time=args.time,
        context_parallel=args.context_parallel, expert_parallel=args.expert_parallel,
        job_name=getattr(args, "job_name", None), executor=args.executor, dry_run=getattr(args, "dry_run", False),
        sets=args.sets, train_flags=flags)
