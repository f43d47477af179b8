"""`sft-launch [options]`: validate, render the run directory, then dry-run / sbatch / run locally."""

from __future__ import annotations

import argparse
import typing
from typing import Any

from launcher.options import Launch, LaunchRequest, parse_value, resolve, train_flag_names
from launcher.profile import STRATEGIES
from train.config import TrainSection

EPILOG = """\
Training flags (--learning_rate ... --compile) are train.toml's [train] keys, named as in
transformers' TrainingArguments. --set KEY=VALUE overrides any key by its dotted name:
profile.<key> (cluster profile) or model./data./train./lora./run.<key> (train.toml); values are
TOML literals (1e-5, true, ["wandb"]) or plain strings. Every launch prints the plan (memory, time,
signal lead) and refuses one that does not fit unless --force. Other commands: sft-launch plan
(same flags, writes nothing, --json), models, status, runs, logs, cancel, plot, eval, chat.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sft-launch", description="Fine-tune a LLaMA-family model on SLURM (or locally): "
        "validate, render a run directory, submit.", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", metavar="FILE", help="cluster profiles (default ./cluster.toml)")
    parser.add_argument("--profile", metavar="NAME", help="profile in the cluster file (default: default_profile)")
    parser.add_argument("--nodes", type=int, default=1, metavar="N", help="number of nodes (default 1)")
    parser.add_argument("--model", required=True, metavar="M", help="preset (sft-launch models), local dir or HF id")
    parser.add_argument("--data", metavar="PATH", help="training data (default: the shipped sample chat set)")
    parser.add_argument("--output", metavar="DIR", help="run directory (default: <storage_root>/<profile>-<model>-<hash>)")
    parser.add_argument("--strategy", choices=STRATEGIES, help="sharding (default: the profile's, else fsdp = FSDP2)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of all weights")
    parser.add_argument("--time", metavar="D-HH:MM:SS", help="time limit (default: the profile's)")
    parser.add_argument("--job-name", metavar="NAME", help="SLURM job name (default: sft-<run dir name>)")
    parser.add_argument("--executor", choices=("sbatch", "local", "submitit"), default="sbatch",
                        help="sbatch (default), local: run here without SLURM, or submitit: through submitit")
    parser.add_argument("--dry-run", action="store_true", help="render and check, submit nothing")
    parser.add_argument("--force", action="store_true",
                        help="launch even when the plan says it does not fit in memory")
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
        group.add_argument(f"--{name}", dest=f"train__{name}", metavar="V", **extra)
    return parser


def request_from_args(args: argparse.Namespace) -> LaunchRequest:
    flags = {}
    for key, value in vars(args).items():
        if key.startswith("train__") and value is not None:
            name = key.removeprefix("train__")
            flags[name] = [str(v) for v in value] if isinstance(value, list) else parse_value(value)
    return LaunchRequest(
        model=args.model, nodes=args.nodes, cluster=args.cluster, profile=args.profile, data=args.data,
        output=args.output, strategy=args.strategy, lora=args.lora, time=args.time, job_name=args.job_name,
        executor=args.executor, dry_run=args.dry_run, sets=args.sets, train_flags=flags)


def _human_count(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.2f}M"


def summary(launch: Launch, plan_text: str = "") -> str:
    """What is about to run, then the plan (launcher/plan_cmd.py) when given."""
    t = launch.train.train
    p = launch.profile
    per_node = f"{p.gpus_per_node} GPU" + (f" ({p.gpu_type})" if p.gpu_type else "") if p.gpus_per_node \
        else f"{p.procs_per_node} CPU processes"
    lines = [
        f"profile     {launch.profile_name}" + (f" ({launch.cluster_file})" if launch.cluster_file else " (embedded)"),
        f"model       {launch.preset.name} ({_human_count(launch.preset.num_params)} params)"
        + (" + LoRA" if launch.train.lora.enabled else ""),
        f"world       {launch.nodes} node(s) x {per_node} = world size {launch.world_size}",
        f"batch       {t.per_device_train_batch_size} per device x {t.gradient_accumulation_steps} accumulation"
        f" x {launch.world_size} = global batch {launch.global_batch}",
        f"strategy    {launch.strategy}" + (" + CPU offload" if p.cpu_offload else ""),
        f"time limit  {launch.time_limit}",
        f"run dir     {launch.run_dir}",
    ]
    if plan_text:
        lines.append(plan_text)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    launch = resolve(request_from_args(args))  # ConfigError -> exit 2 in cli.main; nothing written yet
    from launcher.plan_cmd import plan_launch, refuse_unless_fits
    from launcher.preflight import check_launch
    from launcher.render import record_submission, write_run_dir

    check_launch(launch)  # data rows, model dir, container image, run dir: exit 2 before anything is written
    report = plan_launch(launch)
    print(summary(launch, report.text), flush=True)
    refuse_unless_fits(report, force=args.force)  # does not fit: exit 2 before anything is written
    run_dir = write_run_dir(launch, ["sft-launch", *argv])
    if launch.executor == "local":
        if args.dry_run:
            print(f"dry run: rendered {run_dir}; nothing started")
            return 0
        from launcher.local import run_local

        code = run_local(launch)
        if code == 75:
            print("sft-launch: training checkpointed and stopped (exit 75); run the same command again to resume")
        return code
    if launch.executor == "submitit":  # launcher/submitit_exec.py (issue 7)
        from launcher.submitit_exec import launch_main

        return launch_main(launch, run_dir, dry_run=args.dry_run)
    from launcher import sbatch

    if args.dry_run:
        check = sbatch.test_only(run_dir)
        print(f"sbatch --test-only: {check.message}")
        print("dry run: nothing submitted")
        return 0
    job_id = sbatch.submit(run_dir)
    record_submission(run_dir, job_id)
    print(f"submitted job {job_id}\nfollow it:  tail -F {run_dir}/logs/{job_id}-r0.log\n"
          f"            squeue -j {job_id}")
    return 0
