"""Context parallelism on several GPUs of one host (issue #54 item 5): 8B full fine-tuning on whole documents of
32k, 64k and 128k tokens, each document split over every GPU (parallel.context = N, Ulysses:
train/kernels/context_parallel.py), in one call under 9 minutes:

    python -m bench.multi.gpu_context_parallel --results bench/results/h200/cp-DATE   # every GPU of a 2- or 4-GPU host
    python -m bench.multi.gpu_context_parallel --cpu-smoke        # tiny shape, 2 gloo ranks, CP 2, 2 lengths, < 60 s

(FA4 and the peers' wheels installed first, as for every GPU benchmark: bench/fetch_wheels.sh.)

Ours, one run a length, each rendered by `sft-launch` (`--context_parallel N`, bench/multi/host.py) and started as
a 2-node job (2 machines x N/2 processes): FSDP2 over all N GPUs and parallel.context = N, so one CP group: every
step trains ONE document of exactly seq_len tokens, 1/N of it on each GPU; random weights drawn per shard
(model.init = sharded), per-layer activation checkpointing, compile on, no saves. Activation offload only where
the planner (launcher/plan) says the run does not fit without it: rendered without, planned, rendered again with
it if not (8B fits without on 2 and on 4 H200s at all three lengths: 97 GiB planned at 128k on 2). The FLOPs are
contract.shape's with the attention term of the real document (s̄ = seq_len); the MFU is that of the aggregate
over the timed steps (results_io.clock_start: the first WARMUP_STEPS hold the compile and FA4's JIT).

Time budget (--budget-s, default 540 s: under the device tool's 10 minutes a command, with the table). Before any
run a step is estimated at ASSUMED_MFU (40%: the one-GPU 8B LoRA measured 37.3% at 32k and 39.9% at 128k, 6,580
and 2,959 tokens/s on one H200, with checkpointing as here) of the GPUs' peak by the full fine-tune's FLOPs: on
4 H200s 1.5 s at 32k, 4.0 s at 64k, 12.3 s at 128k; on 2, twice that. Each run also costs OVERHEAD_S = 75 s
(process start, NCCL, sharded init and the first step's compile: the 8B runs in bench/results/h100 logged 3-6 s
to model-ready and 22-55 s first windows). The longest length runs first and gets --longest-steps (20, the 128k
target's "≥ 20 steps") or as many as the budget leaves after reserving MIN_STEPS for each other length; then
from the shortest (the 32k target) up, each gets --steps (8) or what is left, re-estimated from the previous
run's measured step time (scaled by a step's FLOPs) and overhead. A length left fewer than MIN_STEPS is recorded
as skipped, never run short. Planned this way: 4 H200s train 20 steps at 128k (~320 s), 8 at 32k and 8 at 64k
(~195 s together); 2 H200s 9 steps at 128k (~295 s), 8 at 32k and 64k. Each run is killed past the time the
budget leaves it (its logged windows stay in the file).

The peer: TRL/Accelerate's Ulysses sequence parallelism cannot run offline here (PEER_UNAVAILABLE says why), so
each results file carries torchtitan's PUBLISHED figure at its length, named as such (8 H100s, float8, not run
by us), with its MFU by the same FLOP count. Results: one `longctx-llama3-8b-full-<seq_len>-cp<N>.json` per
length through bench/report/results_io (tests/bench/test_results.py re-derives its rates, FLOPs and MFU); the
planner's longest document for 8B on the call's GPUs (planned, not run). A table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.processes import TIMED_OUT
from bench.common.synthetic import write_token_jsonl
from bench.multi import host
from bench.multi.multi_full import failed, kernels, recompiles
from bench.report.results_io import WARMUP_STEPS, throughput_numbers, write_result
from bench.suites.gpu_single import device_peak, windows
from contract.gpus import lookup
from contract.shape import ModelShape
from launcher.plan.memory import GIB
from launcher.plan.planner import make_plan
from launcher.resolve.plan_input import plan_input_from_launch

SHAPE = "llama3-8b"
SEQ_LENS = "32768,65536,131072"
SMOKE_SEQ_LENS = "256,512"
BUDGET_S = 540
ASSUMED_MFU = 0.40  # a step's first estimate (module docstring); later steps are re-estimated from measured ones
OVERHEAD_S = 75.0  # a run's cost beyond its steps, until one is measured
CPU_STEP_S = 2.0  # the smoke's first estimate of a tiny step on CPU (no peak FLOP/s to estimate from)
MIN_STEPS = WARMUP_STEPS + 3  # three timed steps past the warm-up, or the length is skipped
LONGEST_TARGET_STEPS = 20  # the 128k target: >= 20 steps
PORT = 29700
# The targets for 8B full fine-tuning on 4 GPUs (seq_len -> MFU).
TARGET_MFU = {32768: 0.45, 131072: 0.40}
PEER_UNAVAILABLE = (
    "TRL/Accelerate Ulysses SP runs only on DeepSpeed: accelerate 1.15's ParallelismConfig accepts sp_backend "
    "'deepspeed' alone and its _prepare_deepspeed imports deepspeed.runtime.sequence_parallel.ulysses_sp "
    "(deepspeed >= 0.18.2); the lent H200s' image lists no deepspeed among its packages, and PyPI has no deepspeed "
    "wheel to carry offline (pip download --only-binary=:all: deepspeed==0.19.8: no matching distribution)")
# torchtitan's published Llama 3.1 8B context-parallel runs (TorchTitan paper, arXiv 2410.06511, as issue #54
# quotes them): 8 x H100, FSDP + CP, compile, float8 linears, full activation checkpointing. Not run by us.
TORCHTITAN = {"name": "torchtitan (published, not run here)", "source": "TorchTitan, arXiv 2410.06511 (issue #54)",
              "gpus": 8, "gpu_type": "h100", "settings": "FSDP + CP 8, torch.compile, float8, full AC",
              "tokens_per_s_per_gpu": {32768: 3890, 65536: 2540, 131072: 1071}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=None, help="GPUs = parallel.context (default: every visible GPU)")
    parser.add_argument("--seq-lens", default=None, help=f"tokens per document, comma list (default {SEQ_LENS})")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps a length but the longest (default 8; --cpu-smoke: MIN_STEPS)")
    parser.add_argument("--longest-steps", type=int, default=None,
                        help=f"the longest length's steps (default {LONGEST_TARGET_STEPS}; --cpu-smoke: MIN_STEPS)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall-clock budget of the whole call (s)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-context-parallel"))
    parser.add_argument("--results", type=Path, default=None, help="write longctx-*-full-*-cp*.json here")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on 2 gloo ranks (BENCH_CPU_SMOKE)")
    args = parser.parse_args(argv)
    smoke = args.cpu_smoke or host.CPU_SMOKE
    args.steps = args.steps or (MIN_STEPS if smoke else 8)
    args.longest_steps = args.longest_steps or (MIN_STEPS if smoke else LONGEST_TARGET_STEPS)
    args.seq_lens = [int(x) for x in (args.seq_lens or (SMOKE_SEQ_LENS if smoke else SEQ_LENS)).split(",")]
    if args.gpus is None:
        import torch

        args.gpus = 2 if smoke else torch.cuda.device_count()
    if args.gpus < 2 or args.gpus % 2:
        parser.error(f"--gpus {args.gpus}: context parallelism here needs an even number of GPUs >= 2")
    if any(n % args.gpus for n in args.seq_lens):
        parser.error(f"--seq-lens: every length must split evenly over the {args.gpus} GPUs")
    if min(args.steps, args.longest_steps) < MIN_STEPS:
        parser.error(f"--steps/--longest-steps: at least {MIN_STEPS} ({WARMUP_STEPS} warm-up + 3 timed)")
    return args


def step_flops(arch: dict, seq_len: int) -> float:
    """One optimizer step's model FLOPs: one document of seq_len tokens (s̄ = seq_len), full fine-tuning."""
    return seq_len * ModelShape.from_arch(arch).flops_per_token(seq_len)


class Budget:
    """How many steps each length gets inside the call's wall-clock budget (module docstring)."""

    def __init__(self, arch: dict, gpus: int, peak: float | None, seconds: float) -> None:
        self.arch, self.deadline, self.overhead = arch, time.monotonic() + seconds, OVERHEAD_S
        self.per_flop = 1 / (gpus * peak * ASSUMED_MFU) if peak else None  # seconds per model FLOP

    def step_s(self, seq_len: int) -> float:
        return step_flops(self.arch, seq_len) * self.per_flop if self.per_flop else CPU_STEP_S

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def steps(self, seq_len: int, later: list[int], wanted: int) -> tuple[int, float]:
        """(steps, seconds) for this length: `wanted` or fewer, keeping MIN_STEPS for each later length."""
        reserve = sum(self.overhead + MIN_STEPS * self.step_s(n) for n in later)
        seconds = self.left() - reserve
        return min(wanted, int((seconds - self.overhead) / self.step_s(seq_len))), seconds

    def measured(self, seq_len: int, steps: int, step_s: float, wall_s: float) -> None:
        """A finished run: its seconds per model FLOP and its overhead replace the estimates."""
        self.per_flop = step_s / step_flops(self.arch, seq_len)
        self.overhead = max(0.0, wall_s - steps * step_s)


def render(args: argparse.Namespace, run: Path, data: Path, seq_len: int, steps: int, offload: bool) -> Any:
    return host.render(run, SHAPE, data, args.gpus, [
        "--max_steps", str(steps), "--save_steps", "1000000", "--gradient_checkpointing", "true",
        "--context_parallel", str(args.gpus), *host.random_weights(host.shape(SHAPE), sharded=True),
        "--set", f"data.tokens_per_micro_batch={seq_len}", "--set", f"train.model_max_length={seq_len}",
        "--set", f"train.activation_offload={str(offload).lower()}",
        "--set", f"train.compile={str(not host.CPU_SMOKE).lower()}"])


def planned(launch: Any) -> dict[str, Any]:
    """The planner's verdict on a rendered launch: GiB per GPU and whether it fits (None: memory unknown)."""
    plan = make_plan(plan_input_from_launch(launch))
    return {"gib": round(plan.gpu.total / GIB, 2), "fits": plan.fits}


def shape_name() -> str:
    return "tiny" if host.CPU_SMOKE else SHAPE


def prepare(args: argparse.Namespace, seq_len: int, steps: int) -> tuple[Path, dict[str, Any]]:
    """The run directory of one length, with activation offload only where the planner needs it."""
    run = args.out / f"run-{seq_len}"
    shutil.rmtree(run, ignore_errors=True)  # a run of an earlier call would be resumed, its metrics appended to
    data = args.out / f"docs-{seq_len}.jsonl"
    write_token_jsonl(data, [seq_len] * steps, host.shape(SHAPE)["vocab_size"])
    plans = {"without_offload": planned(render(args, run, data, seq_len, steps, False))}
    offload = plans["without_offload"]["fits"] is False
    if offload:
        plans["with_offload"] = planned(render(args, run, data, seq_len, steps, True))
    return run, {"activation_offload": offload, "plan": plans}


def train(args: argparse.Namespace, seq_len: int, steps: int, limit_s: float, port: int) -> dict[str, Any]:
    """One length: render, launch inside `limit_s` (rendering included), the steady-state numbers of its timed
    steps. The runs share one Inductor cache: what one length compiled another may find there."""
    arch = host.shape(SHAPE)
    started = time.monotonic()  # wall_s: rendering and data included, all a run costs the budget
    run, settings = prepare(args, seq_len, steps)
    env = {"TORCH_LOGS": "recompiles", "TORCHINDUCTOR_CACHE_DIR": str(args.out / "inductor-cache")}
    limit_s -= time.monotonic() - started
    code, text = host.launch(run, args.gpus, port, limit_s, env)
    block: dict[str, Any] = {"max_steps": steps, "wall_s": time.monotonic() - started, "gradient_checkpointing": True,
                             "compile": not host.CPU_SMOKE, "kernels": kernels(text), "recompiles": recompiles(text),
                             **settings}
    if code != 0:
        print(text[-4000:])
        return block | failed(run, f"timeout {limit_s:.0f} s" if code == TIMED_OUT else f"exit {code}")
    stats = host.run_stats(run, 0, text, [], "", arch, args.gpus, [seq_len])
    return block | stats | {"windows": windows(run / "metrics.jsonl")}


def published_peer(arch: dict, seq_len: int) -> dict[str, Any] | None:
    """torchtitan's published figure at this length, its MFU by our FLOP count on its GPU's peak (None: none)."""
    per_gpu = TORCHTITAN["tokens_per_s_per_gpu"].get(seq_len)
    if per_gpu is None:
        return None
    peak = lookup(TORCHTITAN["gpu_type"]).peak_tflops_bf16 * 1e12
    numbers = throughput_numbers(arch, [seq_len], per_gpu * TORCHTITAN["gpus"], TORCHTITAN["gpus"], peak)
    return {**{k: v for k, v in TORCHTITAN.items() if k != "tokens_per_s_per_gpu"}, "tokens_per_s_per_gpu": per_gpu,
            "peak_flops": peak, "mfu": numbers["mfu"]}


def record(args: argparse.Namespace, seq_len: int, run: dict[str, Any]) -> dict[str, Any]:
    arch = host.shape(SHAPE)
    gpu, peak = device_peak()
    result = {"shape": shape_name(), "arch": arch, "fine_tune": "full", "seq_len": seq_len,
              "context_parallel": args.gpus, "gpu_count": args.gpus, "gpu": gpu, "peak_flops": peak,
              "budget_s": args.budget_s, "target_mfu": TARGET_MFU.get(seq_len) if args.gpus == 4 else None,
              "peer_unavailable": PEER_UNAVAILABLE, "published_peer": published_peer(arch, seq_len), **run}
    if "real_tokens_per_s" in run:
        result["tokens_per_s_per_gpu"] = run["real_tokens_per_s"] / args.gpus
    return result


def longest_that_fits(args: argparse.Namespace) -> int | None:
    """The planner's longest power-of-two document (from the longest asked, doubling) 8B full fine-tuning fits on
    the call's GPUs with CP over all of them, checkpointing and offload: planned, not run (None: no memory known)."""
    tokens = max(args.seq_lens)
    data = args.out / f"docs-{tokens}.jsonl"
    if not data.is_file():  # the longest length was skipped: a document to render against
        write_token_jsonl(data, [tokens], host.shape(SHAPE)["vocab_size"])
    launch = render(args, args.out / "plan-longest", data, tokens, MIN_STEPS, True)
    inp, best = plan_input_from_launch(launch), None
    while (fits := make_plan(dataclasses.replace(inp, micro_batch_tokens=tokens)).fits) and tokens <= 1 << 24:
        best, tokens = tokens, tokens * 2
    return best if fits is not None else None


def run_all(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """Every length inside the budget, the longest first (its >= 20 steps target), then from the shortest (the
    32k target); the results files as each finishes."""
    arch = host.shape(SHAPE)
    budget = Budget(arch, args.gpus, device_peak()[1], args.budget_s)
    order = [max(args.seq_lens), *sorted(set(args.seq_lens) - {max(args.seq_lens)})]
    done: dict[int, dict[str, Any]] = {}
    for index, seq_len in enumerate(order):
        wanted = args.longest_steps if index == 0 else args.steps
        steps, seconds = budget.steps(seq_len, order[index + 1:], wanted)
        if steps < MIN_STEPS:
            done[seq_len] = {"error": f"skipped: {seconds:.0f} s of the {args.budget_s:.0f} s budget left "
                             f"~{max(0, steps)} steps (< {MIN_STEPS})", "windows": []}
        else:
            print(f"{seq_len} tokens on {args.gpus} GPUs: {steps} steps, ~{budget.step_s(seq_len):.1f} s each "
                  f"+ ~{budget.overhead:.0f} s start, under {seconds:.0f} s", flush=True)
            done[seq_len] = run = train(args, seq_len, steps, seconds, PORT + index)
            if run.get("steps"):
                budget.measured(seq_len, steps, run["seconds"] / run["steps"], run["wall_s"])
        if args.results:
            write_result(args.results / result_name(seq_len, args.gpus), record(args, seq_len, done[seq_len]))
    return done


def result_name(seq_len: int, gpus: int) -> str:
    """longctx-<shape>-full-<seq_len>-cp<N>.json (tests/bench/test_results.py's longctx kind)."""
    return f"longctx-{shape_name()}-full-{seq_len}-cp{gpus}.json"


def table(args: argparse.Namespace, done: dict[int, dict[str, Any]], longest: int | None) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.1f}%"

    lines = [f"| seq_len | CP | steps (timed) | tok/s/GPU | MFU | peak GiB | offload | planned GiB | "
             f"{TORCHTITAN['name']}: tok/s/GPU, MFU |", "|---|---|---|---|---|---|---|---|---|"]
    for seq_len in sorted(done):
        r = record(args, seq_len, done[seq_len])
        peer = r["published_peer"]
        theirs = f"{peer['tokens_per_s_per_gpu']:,}, {pct(peer['mfu'])}" if peer else "-"
        plan = r.get("plan", {}).get("with_offload" if r.get("activation_offload") else "without_offload", {})
        if "error" in r:
            lines.append(f"| {seq_len} | {args.gpus} | {r['error']} | | | | | {plan.get('gib', '-')} | "
                         f"{theirs} |")
            continue
        target = f" (target {pct(r['target_mfu'])})" if r["target_mfu"] else ""
        lines.append(f"| {seq_len} | {args.gpus} | {r['max_steps']} ({r['steps']}) | "
                     f"{r['tokens_per_s_per_gpu']:,.0f} | {pct(r['mfu'])}{target} | {r['peak_mem_gib']:.1f} | {r['activation_offload']} | "
                     f"{plan.get('gib', '-')} | {theirs} |")
    lines.append(f"\nplanner, not run: longest document 8B full fine-tuning fits on {args.gpus} GPUs (CP {args.gpus}, "
                 f"checkpointing, offload): {'unknown' if longest is None else f'{longest:,} tokens'}")
    lines.append(f"peer not run: {PEER_UNAVAILABLE}")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    if args.cpu_smoke and not host.CPU_SMOKE:  # host reads BENCH_CPU_SMOKE on import: start again with it set
        os.execvpe(sys.executable, [sys.executable, "-m", "bench.multi.gpu_context_parallel", *sys.argv[1:]],
                   {**os.environ, "BENCH_CPU_SMOKE": "1"})
    args.out.mkdir(parents=True, exist_ok=True)
    done = run_all(args)
    print(table(args, done, longest_that_fits(args)))


if __name__ == "__main__":
    main()
