"""Bitwise resume on several GPUs after a SIGTERM at a random step (issue #29 item 4; #26's QLoRA resume).

    python -m bench.multi.gpu_resume --gpus 2 --cases fsdp zero3 fsdp-qlora --out OUT --results bench/results/h100/…
    python -m bench.multi.gpu_resume --cpu --cases fsdp --out /tmp/resume        # gloo, tiny shape: the plumbing

Each case is rendered with the real CLI for a profile of --gpus GPUs (bench/suites/gpu_strategies.py's command
line: ~136M-parameter Llama, bf16, `train.deterministic`, checkpointing, 2 micro-batches per step, merged
export) and started as `sft-launch --executor local` starts it, twice at the same time on the same GPUs:
  reference    --steps steps, uninterrupted;
  interrupted  SIGTERM to every process of the job (as SLURM signals a job step) once its metrics.jsonl
               shows a random step in [3, steps - 4]: it saves at the next step boundary and exits;
               the same command then resumes it from that checkpoint to the end.
The two final exports are compared tensor by tensor (bitwise, else the largest difference). The cases run
at the same time too (correctness, not timing). One results file `resume-<gpus>gpu.json`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.multi import host
from bench.suites import gpu_strategies as strategies
from bench.common import processes
from bench.report.results_io import write_result
from bench.suites.strategy_checks import CaseError, compare_exports, last_error_line
from contract import protocol

CASES = {  # name -> (strategy, LoRA, flag replacing --lora)
    "fsdp": ("fsdp", False, ""), "zero3": ("zero3", False, ""), "fsdp-lora": ("fsdp", True, "--lora"),
    "fsdp-qlora": ("fsdp", True, "--qlora"),
}


def command_line(name: str, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The user's command line (gpu_strategies.cli_args), with no scheduled save: the only checkpoint
    is the one the SIGTERM asks for."""
    strategy, lora, flag = CASES[name]
    cmd = strategies.cli_args(strategies.Case(strategy, lora, False), args, run_dir)
    if flag == "--qlora":
        cmd[cmd.index("--lora")] = "--qlora"
    return cmd + ["--set", f"train.save_steps={args.steps * 10}"]


def start(name: str, args: argparse.Namespace, run_dir: Path, log: Path) -> subprocess.Popen:
    """Write the run directory as `sft-launch` does, then start training as its local executor does."""
    from launcher.execute.local import train_command

    launch = host.write_run_dir(command_line(name, args, run_dir))
    command = train_command(launch, protocol.free_port(), protocol.local_attempt_name(time.time()))
    out = log.open("a")
    return subprocess.Popen(command, cwd=strategies.REPO, env=processes.child_env(), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def last_step(run_dir: Path) -> int:
    """The last step metrics.jsonl logged (0 before the first)."""
    path = run_dir / protocol.METRICS_FILE
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line).get("step", 0) for line in lines if line.strip()), default=0)


def wait(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        processes.signal_job(proc, signal.SIGKILL)
        proc.wait()
        return processes.TIMED_OUT


def interrupt_at(proc: subprocess.Popen, run_dir: Path, at_step: int, deadline: float) -> int | None:
    """SIGTERM once the run has logged `at_step`; the last logged step then, None if it ended first."""
    while proc.poll() is None and time.monotonic() < deadline:
        seen = last_step(run_dir)
        if seen >= at_step:
            processes.signal_job(proc, signal.SIGTERM)
            return seen
        time.sleep(0.05)
    return None


def run_case(name: str, args: argparse.Namespace, work: Path, rng: random.Random) -> dict[str, Any]:
    row: dict[str, Any] = {"case": name, "strategy": CASES[name][0], "lora": CASES[name][2] or None,
                           "steps": args.steps, "gpu_count": args.gpus, "bitwise": None, "max_abs_diff": None}
    started, logs = time.monotonic(), args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    reference, run = work / name / "reference", work / name / "interrupted"
    row["sigterm_after_step"] = at = rng.randint(3, args.steps - 4)
    deadline = started + args.run_timeout
    try:
        ref = start(name, args, reference, logs / f"{name}.reference.log")
        job = start(name, args, run, logs / f"{name}.interrupted.log")
        row["signalled_at_logged_step"] = interrupt_at(job, run, at, deadline)
        row["interrupted_exit"] = wait(job, deadline - time.monotonic())
        row["reference_exit"] = wait(ref, deadline - time.monotonic())
        if row["signalled_at_logged_step"] is None:
            raise CaseError(f"the run ended (exit {row['interrupted_exit']}) before step {at}: nothing interrupted")
        if row["reference_exit"] != 0:
            raise CaseError(f"reference exit {row['reference_exit']}: {last_error_line(logs / f'{name}.reference.log')}")
        saved = sorted(p.name for p in (run / "checkpoints").glob("step-*") if (p / "COMPLETE").exists())
        row["stop_checkpoint"] = saved[-1] if saved else None
        if not saved or (run / "export").exists():
            raise CaseError(f"no stop checkpoint (exit {row['interrupted_exit']}) or an export already")
        resumed = start(name, args, run, logs / f"{name}.resumed.log")
        row["resumed_exit"] = wait(resumed, started + 2 * args.run_timeout - time.monotonic())
        if row["resumed_exit"] != 0:
            raise CaseError(f"resumed exit {row['resumed_exit']}: {last_error_line(logs / f'{name}.resumed.log')}")
        if "resumed from" not in (logs / f"{name}.resumed.log").read_text(errors="replace"):
            raise CaseError("the resumed run did not log 'resumed from': it started over")
        row["bitwise"], row["max_abs_diff"] = compare_exports(reference / "export", run / "export")
        row["error"] = ""
    except CaseError as err:
        row["error"] = str(err)
    except Exception as err:  # noqa: BLE001 (a bug in one case must not lose the others' rows)
        row["error"] = f"{type(err).__name__}: {err}"[:300]
    if row["error"]:  # each rank's own output holds the cause; the launcher's log only says which rank failed
        for run_dir in (reference, run):
            ranks = run_dir / protocol.LOGS_DIR / protocol.RANK_LOGS_DIR
            if ranks.is_dir():
                shutil.copytree(ranks, logs / f"{name}.{run_dir.name}.ranks", dirs_exist_ok=True)
    row["seconds"] = round(time.monotonic() - started, 1)
    print(f"[gpu_resume] {name}: {json.dumps(row)}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=["fsdp", "zero3"], choices=sorted(CASES))
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=2048, help="packed tokens per micro-batch")
    parser.add_argument("--run-timeout", type=float, default=240, help="seconds for the first two runs of a case")
    parser.add_argument("--gpu-type", default="h100")
    parser.add_argument("--seed", type=int, default=None, help="for the random steps (default: from the clock)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--results", type=Path, default=None, help="folder of the results file")
    parser.add_argument("--cpu", action="store_true", help="FSDP over gloo, tiny shape")
    args = parser.parse_args(argv)
    args.out, args.compile = args.out.resolve(), False
    seed = args.seed if args.seed is not None else int(time.time())
    work = args.out / "work"
    strategies.write_profile(args, work)
    rng = random.Random(seed)
    steps_at = {name: random.Random(rng.random()) for name in args.cases}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(args.cases)) as pool:
        rows = list(pool.map(lambda n: run_case(n, args, work, steps_at[n]), args.cases))
    record = {"gpu_count": args.gpus, "steps": args.steps, "tokens": args.tokens, "seed": seed,
              "arch": strategies.CPU_ARCH if args.cpu else strategies.GPU_ARCH, "results": rows}
    if args.results:
        write_result(args.results / f"resume-{args.gpus}gpu.json", record)
    print("| case | SIGTERM after step | checkpoint | resumed | final weights vs uninterrupted | error |\n|---|---|---|---|---|---|")
    for r in rows:
        verdict = "bitwise" if r["bitwise"] else f"differ (max {r['max_abs_diff']:.1e})" if r["bitwise"] is False else "-"
        print(f"| {r['case']} | {r['sigterm_after_step']} | {r.get('stop_checkpoint') or '-'} | "
              f"{r.get('resumed_exit', '-')} | {verdict} | {r['error'][:80]} |")
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
