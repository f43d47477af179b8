"""`sft-launch eval RUN`: lm-evaluation-harness and the held-out loss per source on the run's export,
as a one-node SLURM job or here.

The task `heldout` (the default beside `leaderboard` when the run has eval splits) is each data
source's eval loss, perplexity and label tokens on the model, from the run's own train.toml and eval
splits, computed as the training's eval computes it (train/engine/heldout.py).

The evaluation itself is `python -m train.evaluate` (compute side: torch, transformers, lm_eval);
this module only checks the request, builds that command and starts it: locally (`--executor
local`), or in `RUN/eval/<name>.slurm` rendered from templates/eval.slurm.j2 and sbatch-submitted
on the run's profile (one node, data parallel over its GPUs). Results: `RUN/eval/<name>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from contract import __version__, protocol
from contract.command import ACCELERATE_CLI, accelerate_of_this_python
from contract.config import load_train_config
from contract.schema import ConfigError, build
from launcher.ops import evalresults, rundir
from launcher.resolve.profile import EMBEDDED_LOCAL_NAME, EMBEDDED_LOCAL_PROFILE, ClusterProfile, build_profile, \
    format_time_limit, parse_time_limit, read_cluster_file, select_profile
from launcher.usage import Parser

TEMPLATE = "eval.slurm.j2"
EVAL_MODULE = "train.evaluate"  # the compute-side entry point (train/evaluate.py)
EXPORT_MODULE = "train.export_checkpoint"  # checkpoint -> HF model dir (train/export_checkpoint.py)
HELDOUT = protocol.EVAL_HELDOUT_TASK  # our task: each source's held-out loss
DEFAULT_TASKS = "leaderboard"
INSTALL_HINT = "lm-eval is not installed: pip install 'sft-launch[eval]' (or pip install lm-eval)"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_TASK = re.compile(r"^[A-Za-z0-9_.*-]+$")


def checkpoint_step(value: str) -> str:
    """--checkpoint's value: a step number or 'latest' (a usage error otherwise, before the run is read)."""
    if value != "latest" and not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a step number or 'latest', got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="sft-launch eval", description="Run lm-evaluation-harness, and the held-out loss of each data "
        "source, on a run's exported model (one-node SLURM job on the run's profile, or --executor local); "
        "results in RUN/eval/<name>.json.")
    rundir.add_run_arguments(parser)
    parser.add_argument("--tasks", metavar="LIST",
                        help="comma-separated lm-eval tasks/groups, and 'heldout' (each data source's eval loss, "
                        "perplexity and tokens on the run's eval splits); preset 'leaderboard' (Open LLM "
                        "Leaderboard v2, minus the parts whose data is unavailable, with the reason). Default: "
                        "heldout,leaderboard when the run has eval splits, else leaderboard")
    parser.add_argument("--limit", type=float, metavar="N", help="documents per task (for a quick check)")
    parser.add_argument("--num-fewshot", type=int, metavar="K", help="few-shot examples (default: each task's)")
    parser.add_argument("--apply-chat-template", action="store_true", help="prompt through the model's chat template")
    parser.add_argument("--batch-size", default="auto", metavar="B", help="per-process batch size (default auto)")
    parser.add_argument("--include-path", action="append", default=[], metavar="DIR",
                        help="directory of custom lm-eval task YAMLs (repeatable)")
    parser.add_argument("--allow-code-eval", action="store_true",
                        help="allow tasks that execute model-written code (sets HF_ALLOW_CODE_EVAL=1)")
    parser.add_argument("--checkpoint", type=checkpoint_step, metavar="STEP",
                        help="evaluate checkpoints/step-STEP (or 'latest', the newest complete one) instead of the "
                        "export; it is exported first, once")
    parser.add_argument("--every-checkpoint", action="store_true",
                        help="keep watching the run: evaluate each new complete checkpoint in its own job "
                        "(training never waits), until the run finishes; results <name>-step-N")
    parser.add_argument("--name", metavar="NAME", help="results name (default: <tasks>-<UTC time>)")
    parser.add_argument("--executor", choices=("sbatch", "local"), default="sbatch",
                        help="sbatch (default): a one-node job on the run's profile; local: here, now")
    parser.add_argument("--time", metavar="D-HH:MM:SS", help="job time limit (default: the profile's)")
    parser.add_argument("--dry-run", action="store_true", help="render the job script, submit nothing")
    return parser


@dataclass(frozen=True)
class EvalRequest:
    run_dir: Path
    model_dir: Path
    name: str
    output: Path
    args: list[str]  # train.evaluate's arguments
    export_from: Path | None = None  # a checkpoint to export into model_dir first
    consume_checkpoint: bool = False  # export_from is a pinned copy (launcher/commands/eval_watch.py): remove it after


def _check_tasks(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in tasks if not _TASK.match(t)]
    if not tasks or bad:
        raise ConfigError(f"--tasks {text!r}: give comma-separated lm-eval task names" +
                          (f" ({bad[0]!r} is not one)" if bad else ""))
    return tasks


def default_name(tasks: list[str]) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", "+".join(tasks).replace("+", "_"))[:40].strip("-.") or "eval"
    return f"{slug}-{datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%d-%H%M%S')}"


def _check_flags(args: argparse.Namespace) -> None:
    """The flags' own checks (the tasks: `requested_tasks`, which needs the run)."""
    if args.tasks is not None:
        _check_tasks(args.tasks)
    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit {args.limit:g}: must be > 0")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ConfigError(f"--num-fewshot {args.num_fewshot}: must be >= 0")
    if not (args.batch_size == "auto" or args.batch_size.isdigit() and int(args.batch_size) > 0):
        raise ConfigError(f"--batch-size {args.batch_size}: a positive integer or 'auto'")
    for path in args.include_path:
        if not Path(path).is_dir():
            raise ConfigError(f"--include-path {path}: not a directory")
    if args.time is not None:
        try:
            parse_time_limit(args.time)
        except ValueError as err:
            raise ConfigError(f"--time: {err}") from None
    if args.name is not None and not _NAME.match(args.name):
        raise ConfigError(f"--name {args.name!r}: use letters, digits, '.', '_' or '-' (at most 80)")


def has_eval_splits(run_dir: Path) -> bool:
    """Some data source of the run holds out eval examples (train.toml's data section)."""
    return any(source.has_eval for source in load_train_config(run_dir / protocol.TRAIN_CONFIG).data.source_list())


def requested_tasks(args: argparse.Namespace, run_dir: Path) -> list[str]:
    """--tasks, else the default for this run; `heldout` needs eval splits, any other task lm-eval."""
    if args.tasks is None:
        try:
            held_out = has_eval_splits(run_dir)
        except ConfigError:  # a train.toml this version cannot read: no per-source view by default
            held_out = False
        tasks = [HELDOUT] * held_out + [DEFAULT_TASKS]
    else:
        tasks = _check_tasks(args.tasks)
        if HELDOUT in tasks and not has_eval_splits(run_dir):
            raise ConfigError(f"--tasks {HELDOUT}: {run_dir / protocol.TRAIN_CONFIG} holds out no eval split (set "
                              "data.eval_fraction, or eval_fraction / eval_path / eval_split of a [[data.sources]])")
    if any(task != HELDOUT for task in tasks) and importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(INSTALL_HINT)
    return tasks


def model_source(run_dir: Path, checkpoint: str | None) -> tuple[Path, Path | None]:
    """(model dir to evaluate, checkpoint to export into it first or None)."""
    if checkpoint is None:
        return rundir.export_dir(run_dir), None
    complete = rundir.complete_checkpoints(run_dir)
    chosen = complete[-1:] if checkpoint == "latest" else \
        [c for c in complete if c[0] == int(checkpoint)]
    if not chosen:
        steps = ", ".join(str(step) for step, _ in complete) or "none"
        raise ConfigError(f"--checkpoint {checkpoint}: no complete checkpoint with that step in {run_dir} "
                          f"(complete: {steps})")
    step, path = chosen[0]
    model_dir = evalresults.checkpoint_export_dir(run_dir, step)
    return model_dir, None if protocol.is_exported_model(model_dir) else path


def eval_request(args: argparse.Namespace, pinned: Path | None = None) -> EvalRequest:
    """Everything checkable on the login node, checked; ConfigError (exit 2) names the flag.
    `pinned`: a pinned copy of checkpoint args.checkpoint to export from (and remove after)."""
    _check_flags(args)
    run_dir = rundir.resolve_run(args)
    tasks = requested_tasks(args, run_dir)
    if pinned is not None:
        model_dir, export_from = evalresults.checkpoint_export_dir(run_dir, int(args.checkpoint)), pinned
    else:
        model_dir, export_from = model_source(run_dir, args.checkpoint)
    name = args.name or default_name(tasks)
    output = evalresults.results_dir(run_dir) / f"{name}.json"
    flags = ["--model", str(model_dir), "--output", str(output), "--name", name, "--tasks", ",".join(tasks),
             "--batch-size", args.batch_size]
    flags += [item for path in args.include_path for item in ("--include-path", str(Path(path).resolve()))]
    flags += ["--limit", f"{args.limit:g}"] if args.limit is not None else []
    flags += ["--num-fewshot", str(args.num_fewshot)] if args.num_fewshot is not None else []
    flags += ["--apply-chat-template"] if args.apply_chat_template else []
    flags += ["--allow-code-eval"] if args.allow_code_eval else []
    flags += ["--train-config", str(run_dir / protocol.TRAIN_CONFIG)] if HELDOUT in tasks else []
    return EvalRequest(run_dir, model_dir, name, output, flags, export_from, consume_checkpoint=pinned is not None)


def export_args(request: EvalRequest, num_processes: int) -> list[str]:
    """`accelerate launch` arguments (after the rendezvous address) of train.export_checkpoint on one node."""
    run_dir = request.run_dir
    return ["--config_file", str(run_dir / protocol.ACCELERATE_CONFIG), "--num_machines", "1", "--machine_rank", "0",
            "--num_processes", str(num_processes), "-m", EXPORT_MODULE, "--config", str(run_dir / protocol.TRAIN_CONFIG),
            "--checkpoint", str(request.export_from), "--output", str(request.model_dir),
            *(["--remove-checkpoint"] if request.consume_checkpoint else [])]


def run_profile(args: argparse.Namespace, run_dir: Path) -> tuple[str, ClusterProfile]:
    """--profile (from --cluster or ./cluster.toml) when given, else the profile recorded in run.json
    (for --executor local without one: the embedded local profile)."""
    if args.profile:
        cluster = read_cluster_file(Path(args.cluster or "cluster.toml"))
        name, raw = select_profile(cluster, args.profile)
        return name, build_profile(raw, name, cluster, set())
    run = rundir.read_run_json(run_dir)
    if not run.get("profile") and args.executor == "local":
        return EMBEDDED_LOCAL_NAME, build(ClusterProfile, dict(EMBEDDED_LOCAL_PROFILE))
    if not run.get("profile"):
        raise ConfigError(f"RUN {run_dir}: run.json records no profile; pass --cluster FILE --profile NAME")
    return str(run.get("profile_name", "recorded")), build(ClusterProfile, dict(run["profile"]))


def eval_command(python: str, accelerate: tuple[str, ...], num_processes: int, flags: list[str]) -> list[str]:
    """train.evaluate as one process (its exit code intact), or through `accelerate launch`: data
    parallel over the node's `num_processes` GPUs (torchrun reports any failure as 1)."""
    if num_processes <= 1:
        return [python, "-m", EVAL_MODULE, *flags]
    return [*accelerate, "--num_machines", "1", "--num_processes", str(num_processes), "--multi_gpu",
            "--mixed_precision", "no", "--dynamo_backend", "no", "-m", EVAL_MODULE, *flags]


def render_script(request: EvalRequest, profile_name: str, profile: ClusterProfile, time_limit: str,
                  allow_code_eval: bool) -> str:
    from launcher.execute.render import _environment, profile_view
    from launcher.resolve.sbatch_options import profile_sbatch_options, sbatch_line

    processes = max(1, profile.gpus_per_node)
    command = eval_command(profile.python, ACCELERATE_CLI, profile.gpus_per_node, request.args)
    view = profile_view(profile)
    return _environment().get_template(TEMPLATE).render(
        version=__version__, profile_name=profile_name, p=view, container=view["container"],
        job_name=re.sub(r"[^A-Za-z0-9._-]+", "-", f"eval-{request.run_dir.name}")[:64], name=request.name,
        time_limit=time_limit, run_dir=str(request.run_dir), output=str(request.output), num_processes=processes,
        allow_code_eval=allow_code_eval, command=command, checkpoint=str(request.export_from or ""),
        export_args=export_args(request, processes) if request.export_from else [],
        master_port={"base": protocol.MASTER_PORT_BASE, "span": protocol.MASTER_PORT_SPAN},
        # The profile's options and its sbatch pass-through table, `exclusive` included, as launch.slurm has them.
        sbatch_lines=[sbatch_line(flag, value) for flag, value in profile_sbatch_options(profile)])


def _local_env(profile: ClusterProfile, allow_code_eval: bool) -> dict[str, str]:
    """This environment plus the profile's env / HF_HOME, as the job script would export them."""
    env = profile.job_env(dict(os.environ))
    if allow_code_eval:
        env["HF_ALLOW_CODE_EVAL"] = "1"
    return env


def run_local(request: EvalRequest, profile: ClusterProfile, allow_code_eval: bool, dry_run: bool) -> int:
    accelerate = accelerate_of_this_python()
    commands = [eval_command(sys.executable, accelerate, profile.gpus_per_node, request.args)]
    if request.export_from:
        commands.insert(0, [*accelerate, "--main_process_ip", "127.0.0.1", "--main_process_port",
                            str(protocol.free_port()), *export_args(request, max(1, profile.gpus_per_node))])
    code = 0
    for command in commands:
        print(f"{'would run' if dry_run else 'running'}: {shlex.join(command)}", flush=True)
        if not dry_run and code == 0:
            code = subprocess.call(command, cwd=request.run_dir, env=_local_env(profile, allow_code_eval))
    if dry_run:
        return 0
    if code == 0 and request.output.is_file():
        # the evaluation itself has said "results: FILE" (once is enough)
        print(evalresults.format_summary(evalresults.summary(evalresults.read_results(request.output))))
        return 0
    print(f"sft-launch: error: evaluation exited with {code}", file=sys.stderr)
    return protocol.EXIT_USAGE if code == protocol.EXIT_USAGE else protocol.EXIT_FAILURE


def submit(request: EvalRequest, script: str, dry_run: bool) -> int:
    from launcher.execute import sbatch

    evalresults.results_dir(request.run_dir).mkdir(parents=True, exist_ok=True)
    (request.run_dir / protocol.LOGS_DIR).mkdir(exist_ok=True)
    script_path = evalresults.results_dir(request.run_dir) / f"{request.name}.slurm"
    script_path.write_text(script, encoding="utf-8")
    relative = str(script_path.relative_to(request.run_dir))
    if dry_run:
        print(f"sbatch --test-only: {sbatch.test_only(request.run_dir, relative).message}")
        print(f"dry run: rendered {script_path}; nothing submitted")
        return 0
    job_id = sbatch.submit(request.run_dir, relative)
    print(f"submitted eval job {job_id}\nfollow it:  tail -F {request.run_dir}/logs/eval-{request.name}-{job_id}.log\n"
          f"results:    {request.output}")
    return 0


def start(args: argparse.Namespace, pinned: Path | None = None) -> int:
    """One evaluation: run it here, or render and submit its job."""
    request = eval_request(args, pinned)
    profile_name, profile = run_profile(args, request.run_dir)
    if args.executor == "local":
        return run_local(request, profile, args.allow_code_eval, args.dry_run)
    time_limit = format_time_limit(parse_time_limit(args.time or profile.time))  # both checked already
    return submit(request, render_script(request, profile_name, profile, time_limit, args.allow_code_eval),
                  args.dry_run)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.every_checkpoint:
        return start(args)
    if args.checkpoint is not None or args.dry_run:
        raise ConfigError("--every-checkpoint: not with --checkpoint or --dry-run")
    _check_flags(args)  # fail now, not at the first checkpoint
    requested_tasks(args, rundir.resolve_run(args))
    from launcher.commands.eval_watch import watch

    return watch(args, start)
