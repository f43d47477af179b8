"""`sft-launch [options]`: validate, plan, render the run directory, then check or start it with the executor."""

from __future__ import annotations

from launcher.commands.launch_args import build_parser, request_from_args
from launcher.resolve.options import Launch, resolve


def _human_count(count: int) -> str:
    return f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count / 1e6:.2f}M"


def summary(launch: Launch, plan_text: str = "") -> str:
    """What is about to run, then the plan (launcher/commands/plan_cmd.py) when given."""
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
    from launcher.execute.executors import execute
    from launcher.commands.plan_cmd import plan_launch, refuse_unless_fits, refuse_unless_room
    from launcher.ops import ownership
    from launcher.resolve.preflight import check_launch

    if not args.dry_run:  # a run directory a live job owns: refused before anything else is said
        ownership.precheck(launch.run_dir)
    check_launch(launch)  # data rows, model dir, container image, run dir: exit 2 before anything is written
    report = plan_launch(launch)
    print(summary(launch, report.text), flush=True)
    refuse_unless_fits(report, force=args.force)  # does not fit: exit 2 before anything is written
    refuse_unless_room(report, force=args.force)  # the disk cannot hold what the run writes: the same
    if args.dry_run:
        started = execute(launch, ["sft-launch", *argv], dry_run=True)
        started.message += "".join(f"\n{line}" for line in ownership.dry_run_note(launch.run_dir))
    else:
        with ownership.owned(launch.run_dir, launch.executor):  # held through submission (a local run: throughout)
            started = execute(launch, ["sft-launch", *argv], dry_run=False)
    if started.message:
        print(started.message)
    return started.exit_code
