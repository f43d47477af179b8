"""Every strategy the CLI offers, run the way users run it: trains, checkpoints, resumes, exports.

For each case (strategy x LoRA x CPU offload) the runner renders a run directory with the real CLI
(`sft-launch --executor local --dry-run` on a profile of --gpus GPUs, default 1, written next to the
results), then starts training with the local executor's own command (launcher.execute.local.train_command):

  reference  steps 1..N, a checkpoint at step N/2 (train.save_steps), export at N
  resumed    a fresh run directory holding only that step-N/2 checkpoint: a new process resumes
             from it and trains to N, then exports

and checks: the loss falls; the resumed export equals the reference export (bitwise, else the largest
difference is reported); the export loads with `AutoModelForCausalLM.from_pretrained`. It reports
s/step (median over logged steps, from metrics.jsonl), the peak GPU memory the run logged
(torch.cuda.max_memory_allocated) and the planner's prediction for the same launch
(launcher.commands.plan_cmd.plan_input_from_launch -> launcher.plan.planner.make_plan).

GPU machine (deepspeed and its dependencies from wheels, see BENCHMARKS.md):
    python3 bench/suites/gpu_strategies.py --out OUT_DIR          # all cases, table + OUT_DIR/gpu_strategies.json
    python3 bench/suites/gpu_strategies.py --cases zero3-lora-offload --jobs 1
    python3 bench/suites/gpu_strategies.py --gpus 2 --jobs 1 --out OUT_DIR   # sharded over 2 GPUs
CPU (the plumbing only: FSDP over gloo, tiny shape, no memory numbers):
    python3 bench/suites/gpu_strategies.py --cpu --cases fsdp --out /tmp/gs
Every case runs under its own timeout; a failing case is recorded with the tail of its log and the
runner goes on. Exit status: 0 when every case that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common.processes import run_logged  # after the sys.path line: runnable as a script
from bench.report.results_io import write_result
from bench.suites.strategy_checks import (
    CaseError,
    compare_exports,
    export_loads,
    last_error_line,
    predicted_peak,
    step_stats,
)
from contract import protocol
from contract.strategies import STRATEGIES as STRATEGY_SPECS
from launcher.ops.rundir import read_metrics

STRATEGIES = ("fsdp", "fsdp1", "zero2", "zero3")
# ~135M parameters (vocabulary of the shipped tokenizer): big enough that memory is not all overhead.
GPU_ARCH = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 4,
            "intermediate_size": 2816}
CPU_ARCH: dict[str, int] = {}  # the tiny preset as it is
GPU_PROFILE = """[profiles.gpus]
gpus_per_node = {gpus}
gpu_type = "{gpu_type}"
storage_root = "{root}"
time = "1:00:00"
signal_lead_s = 60
"""


@dataclass(frozen=True)
class Case:
    strategy: str
    lora: bool
    offload: bool

    @property
    def name(self) -> str:
        return "-".join([self.strategy] + (["lora"] if self.lora else []) + (["offload"] if self.offload else []))


def all_cases() -> list[Case]:
    """FSDP2 first (the reference for timings), then the other strategies, then offload where the CLI
    offers it (contract.strategies: no_cpu_offload)."""
    return [Case(s, lora, offload) for offload in (False, True) for lora in (False, True) for s in STRATEGIES
            if not (offload and STRATEGY_SPECS[s].no_cpu_offload)]


@dataclass
class Result:
    case: str
    strategy: str
    lora: bool
    offload: bool
    trains: bool | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    resume_bitwise: bool | None = None
    resume_max_abs_diff: float | None = None
    export_loads: bool | None = None
    s_per_step: float | None = None
    peak_gib: float | None = None
    peak_reserved_gib: float | None = None
    predicted_allocated_gib: float | None = None
    predicted_reserved_gib: float | None = None
    plan_input: dict[str, Any] | None = None
    steps: int = 0
    seconds: float = 0.0
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.trains) and bool(self.resume_bitwise) and bool(self.export_loads)


# --------------------------------------------------------------------------- rendering and launching

def cli_args(case: Case, args: argparse.Namespace, output: Path) -> list[str]:
    """The user's command line for this case (without --dry-run)."""
    arch = CPU_ARCH if args.cpu else GPU_ARCH
    sets = [f"model.arch.{k}={v}" for k, v in arch.items()] + [
        f"train.max_steps={args.steps}", f"train.save_steps={args.steps // 2}", "train.save_total_limit=3",
        "train.logging_steps=1", "train.gradient_accumulation_steps=2", "train.learning_rate=1e-3",
        "train.warmup_ratio=0.0", f"train.compile={str(args.compile).lower()}",  # cosine: the schedule resumes too
        "train.gradient_checkpointing=true", "train.model_max_length=512", "train.deterministic=true",
        f"data.tokens_per_micro_batch={args.tokens}", f"model.precision={'fp32' if args.cpu else 'bf16'}",
        f"profile.cpu_offload={'true' if case.offload else 'false'}", "lora.merge_on_export=true"]
    cmd = ["--executor", "local", "--model", "tiny", "--strategy", case.strategy, "--output", str(output)]
    if not args.cpu:
        cmd += ["--cluster", str(args.cluster), "--profile", "gpus"]
    if case.lora:
        cmd.append("--lora")
    for item in sets:
        cmd += ["--set", item]
    return cmd


def render(case: Case, args: argparse.Namespace, run_dir: Path, log: Path) -> None:
    cmd = [sys.executable, "-m", "launcher.cli", *cli_args(case, args, run_dir), "--dry-run"]
    if run_logged(cmd, log, 120) != 0:
        raise CaseError(f"render failed: {last_error_line(log)}")


def resolve_case(case: Case, args: argparse.Namespace, run_dir: Path) -> Any:
    """The launcher's Launch for this case, parsed from the same command line as `render`."""
    from launcher.commands.launch import build_parser, request_from_args
    from launcher.resolve.options import resolve

    return resolve(request_from_args(build_parser().parse_args(cli_args(case, args, run_dir) + ["--dry-run"])))


def train(launch: Any, log: Path, timeout: float) -> int:
    """Start training exactly as `sft-launch --executor local` does (into the run directory it writes)."""
    from launcher.execute.local import train_command
    from launcher.execute.render import write_run_dir as write

    write(launch, ["bench/suites/gpu_strategies.py"])
    attempt = protocol.local_attempt_name(time.time())  # each rank's whole output: logs/ranks/<attempt>/
    return run_logged(train_command(launch, protocol.free_port(), attempt), log, timeout)


# --------------------------------------------------------------------------- one case

def run_case(case: Case, args: argparse.Namespace, work: Path) -> Result:
    """Render, train (reference), resume (fresh dir + the mid checkpoint), compare, load the export."""
    result = Result(case.name, case.strategy, case.lora, case.offload, steps=args.steps)
    started = time.monotonic()
    logs = args.out / "logs" / case.name
    logs.mkdir(parents=True, exist_ok=True)
    reference, resumed = work / case.name / "reference", work / case.name / "resumed"
    try:
        _run_and_check(case, args, reference, resumed, logs, result)
    except CaseError as err:
        result.error = str(err)
    except Exception as err:  # noqa: BLE001 (a bug in a check must not stop the other cases)
        result.error = f"{type(err).__name__}: {err}"[:300]
    finally:
        result.seconds = round(time.monotonic() - started, 1)
        for run_dir in (reference, resumed):  # logs and metrics are kept; weights are not
            for name in ("metrics.jsonl", "train.toml", "accelerate.yaml", "deepspeed.json"):
                if (run_dir / name).exists():
                    shutil.copy(run_dir / name, logs / f"{run_dir.name}.{name}")
        if not args.keep:
            shutil.rmtree(work / case.name, ignore_errors=True)
    return result


def _run_and_check(case: Case, args: argparse.Namespace, reference: Path, resumed: Path, logs: Path,
                   result: Result) -> None:
    render(case, args, reference, logs / "render.log")
    launch = resolve_case(case, args, reference)
    if not args.cpu:
        result.predicted_allocated_gib, result.predicted_reserved_gib, result.plan_input = predicted_peak(launch)
    code = train(launch, logs / "reference.log", run_timeout(args))
    if code != 0:
        raise CaseError(f"reference run exit {code}: {last_error_line(logs / 'reference.log')}")
    records = read_metrics(reference)
    result.loss_first, result.loss_last, result.s_per_step, result.peak_gib = step_stats(records)
    reserved = [r["peak_reserved_gib"] for r in records if r.get("peak_reserved_gib") is not None]
    result.peak_reserved_gib = max(reserved) if reserved else None
    result.trains = result.loss_first is not None and result.loss_last < result.loss_first
    mid = reference / "checkpoints" / f"step-{args.steps // 2:08d}"
    if not (mid / "COMPLETE").exists():
        raise CaseError(f"no complete checkpoint {mid.name} in the reference run")
    render(case, args, resumed, logs / "render-resumed.log")
    shutil.copytree(mid, resumed / "checkpoints" / mid.name)
    code = train(resolve_case(case, args, resumed), logs / "resumed.log", run_timeout(args))
    if code != 0:
        raise CaseError(f"resumed run exit {code}: {last_error_line(logs / 'resumed.log')}")
    if "resumed from" not in (logs / "resumed.log").read_text(errors="replace"):
        raise CaseError("the resumed run did not log 'resumed from': it started over")
    result.resume_bitwise, result.resume_max_abs_diff = compare_exports(reference / "export", resumed / "export")
    export_loads(reference / "export")
    result.export_loads = True
    if case.lora and not (reference / "export" / "adapter" / "adapter_config.json").exists():
        result.notes.append("no adapter/ beside the merged export")


# --------------------------------------------------------------------------- report

def fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec)


def print_table(results: list[Result], header: str) -> None:
    print(header)
    print(f"{'case':<22}{'trains':>7}{'resume':>8}{'max|d|':>9}{'export':>7}{'s/step':>8}{'peak':>7}"
          f"{'pred':>7}{'err%':>7}  error")
    for r in results:
        err = (f"{100 * (r.predicted_allocated_gib - r.peak_gib) / r.peak_gib:+.0f}"
               if r.peak_gib and r.predicted_allocated_gib else "-")
        resume = "bitwise" if r.resume_bitwise else fmt(r.resume_bitwise)
        print(f"{r.case:<22}{fmt(r.trains):>7}{resume:>8}{fmt(r.resume_max_abs_diff, '.1e'):>9}"
              f"{fmt(r.export_loads):>7}{fmt(r.s_per_step, '.3f'):>8}{fmt(r.peak_gib, '.2f'):>7}"
              f"{fmt(r.predicted_allocated_gib, '.2f'):>7}{err:>7}  {r.error}")


def environment() -> dict[str, Any]:
    """Versions and device, so a failure can be read without access to the machine."""
    info: dict[str, Any] = {"python": sys.version.split()[0]}
    for module in ("torch", "transformers", "accelerate", "peft", "deepspeed"):
        try:
            info[module] = __import__(module).__version__
        except Exception as err:  # noqa: BLE001 (deepspeed may be missing or fail to import: say why)
            info[module] = f"unavailable ({type(err).__name__}: {str(err)[:120]})"
    import torch

    info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    info["torch_cuda"] = torch.version.cuda
    nvcc = shutil.which("nvcc") or (Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=20, check=False).stdout
        info["nvcc"] = out.strip().splitlines()[-1] if out.strip() else "no output"
    except OSError as err:
        info["nvcc"] = f"not found ({err})"
    return info


def select(args: argparse.Namespace) -> list[Case]:
    cases = all_cases()
    if args.cpu:  # CPU: only what CPU runs (item 2 of issue #17 decides the rest)
        cases = [c for c in cases if c.strategy == "fsdp" and not c.offload]
    if args.cases:
        cases = [c for c in cases if c.name in args.cases]
        unknown = set(args.cases) - {c.name for c in cases}
        if unknown:
            raise SystemExit(f"--cases: unknown or not runnable here: {', '.join(sorted(unknown))}")
    return cases


def run_timeout(args: argparse.Namespace) -> float:
    """--run-timeout, cut so that no run outlives --deadline-s (the table must still be printed)."""
    return max(1.0, min(args.run_timeout, args.hard_deadline - time.monotonic()))


def run_all(cases: list[Case], args: argparse.Namespace, work: Path, env: dict[str, Any]) -> list[Result]:
    """Up to --jobs cases at once (one GPU, small models); cases not started within --budget-s are
    skipped, runs still going at --deadline-s are killed; the JSON is rewritten after every case."""
    started = time.monotonic()
    args.hard_deadline = started + args.deadline_s
    done: list[Result] = []
    lock = threading.Lock()

    def guarded(case: Case) -> Result:
        if time.monotonic() - started > args.budget_s:
            result = Result(case.name, case.strategy, case.lora, case.offload, error="skipped: over --budget-s")
        else:
            result = run_case(case, args, work)
        print(f"[gpu_strategies] {case.name}: {'ok' if result.passed else 'FAILED'} in {result.seconds:.0f} s"
              f"{' - ' + result.error if result.error else ''}", flush=True)
        with lock:
            done.append(result)
            write_json(args, env, done)
        return result

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return list(pool.map(guarded, cases))


def write_json(args: argparse.Namespace, env: dict[str, Any], results: list[Result]) -> None:
    record = {"environment": env, "args": {k: str(v) for k, v in vars(args).items()},
              "results": [asdict(r) | {"passed": r.passed} for r in results]}
    for path in filter(None, [args.out / "gpu_strategies.json", args.results]):
        write_result(path, record)


def calibration_points(results: list[Result], env: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured runs as tests/fixtures/memory_calibration.json points (issue #17 item 3). The peak is
    the training process's since start (model build included), as train/observe/metrics.py logs it."""
    points = []
    for r in results:
        if r.error or not (r.peak_gib and r.peak_reserved_gib and r.plan_input):
            continue
        points.append({
            "name": f"strategies-{r.case}-{r.plan_input['gpus_per_node']}gpu", "plan_input": r.plan_input,
            "measured_allocated_gib": round(r.peak_gib, 3), "measured_reserved_gib": round(r.peak_reserved_gib, 3),
            "predicted_allocated_gib": round(r.predicted_allocated_gib or 0, 3),
            "predicted_reserved_gib": round(r.predicted_reserved_gib or 0, 3),
            "device_name": env["device"], "steps": r.steps, "median_step_s": r.s_per_step,
            "versions": {k: env[k] for k in ("torch", "transformers", "accelerate", "deepspeed")},
            "source": "bench/suites/gpu_strategies.py"})
    return points


def write_profile(args: argparse.Namespace, work: Path) -> None:
    """The cluster profile (--gpus GPUs) the cases render with (args.cluster)."""
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    args.cluster = work / "cluster.toml"
    args.cluster.write_text(GPU_PROFILE.format(gpus=args.gpus, gpu_type=args.gpu_type, root=work / "runs"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_strategies.json and the logs")
    parser.add_argument("--results", type=Path, default=None,
                        help="also write the results here (a bench/results file; never edit it afterwards)")
    parser.add_argument("--cases", nargs="*", help="case names, e.g. fsdp zero3-lora-offload (default: all)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps; the checkpoint is at steps/2")
    parser.add_argument("--tokens", type=int, default=2048, help="packed tokens per micro-batch")
    parser.add_argument("--jobs", type=int, default=3, help="cases at once (timings are then shared-GPU timings)")
    parser.add_argument("--run-timeout", type=float, default=240, help="seconds per training run")
    parser.add_argument("--budget-s", type=float, default=330, help="start no case after this many seconds")
    parser.add_argument("--deadline-s", type=float, default=480, help="kill runs still going after this many seconds")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per run (the profile's gpus_per_node)")
    parser.add_argument("--gpu-type", default="h100", help="profile gpu_type (the planner's device)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the decoder layers (the GPU default; off here for the device time)")
    parser.add_argument("--cpu", action="store_true", help="CPU plumbing check: FSDP over gloo, tiny shape")
    parser.add_argument("--calibration", type=Path,
                        help="merge the measured peaks into this fixture (tests/fixtures/memory_calibration.json)")
    parser.add_argument("--keep", action="store_true", help="keep run directories (weights) under OUT/work")
    args = parser.parse_args(argv)
    args.hard_deadline = time.monotonic() + args.deadline_s  # run_all restarts the clock
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = select(args)
    env = environment()
    print("[gpu_strategies] " + json.dumps(env), flush=True)
    work = args.out / "work" if args.keep else Path(tempfile.mkdtemp(prefix="gpu-strategies-"))
    write_profile(args, work)
    results = run_all(cases, args, work, env)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    header = (f"{env['device']}, {args.steps} steps x 2 micro-batches x {args.tokens} tokens, "
              f"{args.jobs} case(s) at once; peak/pred = GiB allocated (measured / planner)")
    print_table(results, header)
    write_json(args, env, results)
    if args.calibration:
        from bench.suites.memory_calibration import write_out

        points = calibration_points(results, env)
        write_out(args.calibration, points, smoke=False)
        print(f"[gpu_strategies] {len(points)} calibration point(s) merged into {args.calibration}")
    return 0 if all(r.passed for r in results if not r.error.startswith("skipped")) else 1


if __name__ == "__main__":
    sys.exit(main())
