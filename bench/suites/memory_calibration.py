"""Measure the peak GPU memory of real training steps and compare it with launcher.plan.planner's prediction.

Each case runs in its own `accelerate launch` (FSDP2, bf16, an accelerate.yaml in the shape the
launcher renders) of this file in `--worker` mode: random-init LlamaForCausalLM built on the GPU,
optional non-reentrant gradient checkpointing, AdamW, `Accelerator.prepare`, then a few
forward+backward+step iterations on one packed micro-batch of T tokens. The peak counters are reset
after `prepare` (so the one-off fp32 model build is not counted: the planner predicts the training
peak) and read at the end: torch.cuda.max_memory_allocated / max_memory_reserved, max over ranks.

GPU machine, from the repository root (about 2-3 minutes per invocation on one H100 / 4 GPUs):
    python bench/suites/memory_calibration.py --gpus 1 --out tests/fixtures/memory_calibration.json
    python bench/suites/memory_calibration.py --gpus 4 --out tests/fixtures/memory_calibration.json
Points with the same name are replaced, others kept. On CPU, `--cpu-smoke` runs a tiny shape through
the same launch path and records only `smoke_results` (no measurement is ever invented).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.peers.peer_fsdp import accelerate_yaml  # noqa: E402  (after the sys.path line: runnable as a script)

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, tie_word_embeddings=False)
MULTI = 0  # placeholder: the case runs on --gpus GPUs
# PlanInput fields fixed by how `run_worker` trains: `torch.optim.AdamW(params)` with no `fused`/`foreach`
# argument runs torch's foreach implementation on CUDA (DTensor params included), unlike train/engine/optim.py's
# fused AdamW. Points recorded before this field existed are compared with it too.
WORKER_PLAN_INPUT = {"adamw_impl": "foreach", "hold_outputs": True}


@dataclass(frozen=True)
class Case:
    name: str
    shape: str  # key of bench.common.synthetic.SHAPES, or "tiny"
    layers: int | None  # reduce num_hidden_layers so the shape fits one GPU
    gpus: int
    checkpointing: bool
    tokens: int  # packed tokens per micro-batch per GPU


CASES = [
    Case("1b-ckpt-8k", "llama3.2-1b", None, 1, True, 8192),
    Case("1b-nockpt-4k", "llama3.2-1b", None, 1, False, 4096),
    Case("8b-L4-ckpt-8k", "llama3-8b", 4, 1, True, 8192),
    Case("8b-L4-nockpt-4k", "llama3-8b", 4, 1, False, 4096),
    Case("1b-ckpt-8k", "llama3.2-1b", None, MULTI, True, 8192),
    Case("1b-nockpt-4k", "llama3.2-1b", None, MULTI, False, 4096),
    Case("8b-ckpt-8k", "llama3-8b", None, MULTI, True, 8192),
    Case("8b-nockpt-2k", "llama3-8b", None, MULTI, False, 2048),
]
SMOKE = Case("tiny-smoke", "tiny", None, 1, True, 64)


def arch_for(case: Case) -> dict:
    from bench.common.synthetic import SHAPES

    arch = dict(TINY if case.shape == "tiny" else SHAPES[case.shape])
    if case.layers:
        arch["num_hidden_layers"] = case.layers
    arch["max_position_embeddings"] = max(case.tokens, 2048)
    return arch


# --------------------------------------------------------------------------- worker (torch side)

def run_worker(spec_path: str) -> None:
    import torch
    from accelerate import Accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = json.loads(Path(spec_path).read_text())
    on_gpu = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not on_gpu)
    torch.manual_seed(0)
    # sdpa on one long causal sequence: the same saved tensors as varlen attention over packed documents
    config = LlamaConfig(**spec["arch"], use_cache=False, attn_implementation="sdpa")
    with torch.device(accelerator.device):
        model = LlamaForCausalLM(config)
    if spec["checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    generator = torch.Generator().manual_seed(accelerator.process_index)
    step_times = []
    for _ in range(spec["steps"]):
        ids = torch.randint(100, config.vocab_size, (1, spec["tokens"]), generator=generator).to(accelerator.device)
        start = time.perf_counter()
        outputs = model(input_ids=ids, labels=ids)  # `outputs` (the logits) lives through backward
        accelerator.backward(outputs.loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del outputs
        if on_gpu:
            torch.cuda.synchronize()
        step_times.append(time.perf_counter() - start)
    peaks = [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()] if on_gpu else [0, 0]
    gathered = accelerator.gather(torch.tensor([peaks], dtype=torch.float64, device=accelerator.device))
    if accelerator.is_main_process:
        import accelerate
        import transformers

        per_rank = gathered.reshape(-1, 2).tolist()
        result = {
            "device_name": torch.cuda.get_device_name() if on_gpu else "cpu",
            "world_size": accelerator.num_processes,
            "distributed_type": str(accelerator.distributed_type),
            "allocated_gib": max(r[0] for r in per_rank) / 2**30 if on_gpu else None,
            "reserved_gib": max(r[1] for r in per_rank) / 2**30 if on_gpu else None,
            "per_rank_gib": [[a / 2**30, r / 2**30] for a, r in per_rank],
            "step_times_s": step_times,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "accelerate": accelerate.__version__},
        }
        Path(spec["result"]).write_text(json.dumps(result, indent=1))
    accelerator.wait_for_everyone()


# --------------------------------------------------------------------------- driver (no torch)

def launch_case(case: Case, args: argparse.Namespace, workdir: Path) -> dict | None:
    """Run one case under `accelerate launch`; the worker's result dict, or None on failure."""
    gpus = args.gpus if case.gpus == MULTI else case.gpus
    case_dir = workdir / f"{case.name}-{gpus}gpu"
    case_dir.mkdir(parents=True)
    # The model is built on the device by the worker: no CPU-RAM-efficient loading
    yaml_path = accelerate_yaml(case_dir, gpus, "no" if args.cpu_smoke else "bf16", ram_efficient_loading=False)
    spec = {"arch": arch_for(case), "tokens": case.tokens, "checkpointing": case.checkpointing,
            "steps": args.steps, "result": str(case_dir / "result.json")}
    (case_dir / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(yaml_path),
           str(Path(__file__).resolve()), "--worker", str(case_dir / "spec.json")]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(cmd, env=env, timeout=args.case_timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        print(f"{case.name}: timed out after {args.case_timeout} s", file=sys.stderr)
        return None
    result_path = Path(spec["result"])
    if proc.returncode != 0 or not result_path.exists():
        print(f"{case.name}: exit {proc.returncode}\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(result_path.read_text()) | {"gpus": gpus, "arch": spec["arch"]}


def plan_input_for(case: Case, result: dict, gpu_type: str) -> dict:
    """The PlanInput fields that describe this measurement (the rest keep their defaults)."""
    return {"arch": result["arch"], "nodes": 1, "gpus_per_node": result["gpus"], "gpu_type": gpu_type,
            "strategy": "fsdp", "gradient_checkpointing": case.checkpointing,
            "micro_batch_tokens": case.tokens, "precision": "bf16"} | WORKER_PLAN_INPUT


def to_point(case: Case, result: dict, args: argparse.Namespace) -> dict:
    from contract.gpus import gpu_type_from_device_name
    from launcher.plan.memory import GIB
    from launcher.plan.planner import make_plan, plan_input_from_dict

    gpu_type = gpu_type_from_device_name(result["device_name"]) or args.gpu_type
    plan_input = plan_input_for(case, result, gpu_type)
    gpu = make_plan(plan_input_from_dict(plan_input)).gpu
    return {
        "name": f"{case.name}-{result['gpus']}gpu", "plan_input": plan_input,
        "measured_allocated_gib": round(result["allocated_gib"], 3) if result["allocated_gib"] else None,
        "measured_reserved_gib": round(result["reserved_gib"], 3) if result["reserved_gib"] else None,
        "predicted_allocated_gib": round(gpu.allocated / GIB, 3),
        "predicted_reserved_gib": round(gpu.reserved / GIB, 3),
        "device_name": result["device_name"], "steps": args.steps,
        "median_step_s": sorted(result["step_times_s"])[len(result["step_times_s"]) // 2],
        "versions": result["versions"], "git_sha": git_sha(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def git_sha() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def error_pct(predicted: float, measured: float | None) -> str:
    return "      -" if not measured else f"{100 * (predicted - measured) / measured:+6.1f}%"


def print_table(points: list[dict]) -> None:
    print(f"{'case':<24}{'pred alloc':>11}{'meas alloc':>11}{'err':>8}{'pred resv':>11}{'meas resv':>11}"
          f"{'err':>8}{'s/step':>8}")
    for p in points:
        alloc, resv = p["measured_allocated_gib"], p["measured_reserved_gib"]
        print(f"{p['name']:<24}{p['predicted_allocated_gib']:>11.2f}{alloc or 0:>11.2f}"
              f"{error_pct(p['predicted_allocated_gib'], alloc):>8}{p['predicted_reserved_gib']:>11.2f}"
              f"{resv or 0:>11.2f}{error_pct(p['predicted_reserved_gib'], resv):>8}{p['median_step_s']:>8.2f}")


def write_out(path: Path, points: list[dict], smoke: bool) -> None:
    """Merge into the fixture: same-name points are replaced; smoke runs only fill `smoke_results`."""
    data = json.loads(path.read_text()) if path.exists() else {"format": 1, "tolerance": 0.15, "points": []}
    if smoke:
        data["smoke_results"] = points
    else:
        names = {p["name"] for p in points}
        data["points"] = [p for p in data.get("points", []) if p["name"] not in names] + points
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", type=int, default=1, help="1 = the single-GPU cases; N > 1 = the multi-GPU cases on N GPUs")
    parser.add_argument("--cases", nargs="*", help="case names to run (default: all for --gpus)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per case (peak needs >= 2: AdamW state)")
    parser.add_argument("--out", type=Path, help="fixture JSON to merge the points into")
    parser.add_argument("--gpu-type", default="h100", help="planner gpu_type when the device name is unknown")
    parser.add_argument("--case-timeout", type=int, default=150)
    parser.add_argument("--budget-s", type=int, default=450, help="skip remaining cases after this many seconds")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU: tests the launch path only")
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return 0
    if args.cpu_smoke:
        cases, args.gpus, args.steps = [SMOKE], 1, min(args.steps, 2)
    else:
        cases = [c for c in CASES if (c.gpus == 1) == (args.gpus == 1)]
        cases = [c for c in cases if not args.cases or c.name in args.cases]
    start, points = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="memcal-") as tmp:
        for case in cases:
            if time.monotonic() - start > args.budget_s:
                print(f"{case.name}: skipped (over --budget-s {args.budget_s})", file=sys.stderr)
                continue
            result = launch_case(case, args, Path(tmp))
            if result is not None:
                points.append(to_point(case, result, args))
    print_table(points)
    if args.out:
        write_out(args.out, points, args.cpu_smoke)
    return 0 if len(points) == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
