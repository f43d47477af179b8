"""Multi-GPU benchmark on one host, started exactly as a 2-node job would be (2 machines x G/2
processes, machine_rank 0 and 1, the accelerate.yaml and train.toml rendered by `sft-launch`).

    python -m bench.multi.gpu_multi --gpus 4 --out /tmp/bench-multi --results bench/results

Measures, in one call:
  1. disk write bandwidth (the bound for checkpoint saves);
  2. an 8B Llama-3-shaped safetensors checkpoint with random weights, written once;
  3. naive loading (every rank reads the checkpoint) vs our rank-0-only loading: peak RSS per rank
     and load time;
  4. 8B FSDP2 training throughput / MFU, a sharded checkpoint save, then a resumed run (resume time);
  5. 1B weak scaling: tokens/s per GPU on 1 GPU vs on all GPUs;
  6. (phase 8b-fp8, bench/multi/multi_fp8.py) 8B full fine-tuning, --precision fp8 against our bf16 path in the
     same call, same documents and settings (random weights drawn per shard, FSDP2, compile, no
     checkpointing, --tokens8b-fp8 tokens/GPU): the speed-up;
  7. (phase 8b-peer, bench/multi/multi_full.py) 8B full fine-tuning, ours (random weights, compile, no
     checkpointing, one timed save) against TRL's SFTTrainer under accelerate FSDP2, each side under its
     own time limit, --repeat N runs a side alternating (default 3): multi-<gpus>gpu-8b-full.json.
Prints a table last.

    python -m bench.multi.gpu_multi --gpus 4 --only 8b-peer --repeat 3 --results DIR   # 8b-peer only (never by default)

    python -m bench.multi.gpu_multi --gpus 2 --skip naive,8b,scaling,8b-mfu --tag fp8 --results DIR   # FP8 only
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.synthetic import sample_lengths, write_token_jsonl
from bench.multi import multi_fp8, multi_full
from bench.multi.host import (CPU_SMOKE, DOCS, MAX_DOC_TOKENS, ROOT, launch, random_weights, render, run_stats,
                              save_line, shape, tagged)
from bench.report.results_io import write_result

PHASES = ("naive", "8b", "scaling", "8b-mfu", "8b-fp8", "8b-peer")


def disk_write_gbps(folder: Path, gib: int = 4) -> float:
    path = folder / "ddtest.bin"
    start = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={gib * 64}", "conv=fsync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - start
    path.unlink()
    return gib * 2**30 / seconds / 1e9


def write_checkpoint(folder: Path, arch: dict) -> float:
    """Random-weight bf16 safetensors checkpoint (+ the tiny tokenizer); returns seconds."""
    code = f"""
import torch, shutil
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(**{arch!r})
with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained({str(folder)!r}, max_shard_size="5GB")
import train, pathlib
tok = pathlib.Path(train.__file__).parent / "assets" / "tiny-tokenizer"
for f in tok.iterdir(): shutil.copy(f, {str(folder)!r})
"""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return time.perf_counter() - start


NAIVE_LOAD = """
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
t = time.perf_counter()
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
print(json.dumps({"seconds": time.perf_counter() - t,
                  "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}))
"""


def naive_loading(folder: Path, ranks: int) -> list[dict]:
    """Every rank reads the whole checkpoint into CPU RAM (fp32 master weights), all at once."""
    procs = [subprocess.Popen([sys.executable, "-c", NAIVE_LOAD, str(folder)], stdout=subprocess.PIPE, text=True)
             for _ in range(ranks)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options of every phase, the lengths of the documents (args.lengths) and the phases to skip
    (args.skip_phases: --only's complement, or --skip plus 8b-peer)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-multi"))
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--steps8b", type=int, default=12)
    parser.add_argument("--tokens8b", type=int, default=16384)
    parser.add_argument("--tokens1b", type=int, default=16384)
    parser.add_argument("--tokens8b-mfu", type=int, default=8192)
    multi_fp8.add_arguments(parser)
    parser.add_argument("--skip", default="", help=f"comma list of phases to skip: {','.join(PHASES)}")
    parser.add_argument("--only", default="", help="comma list of the phases to run; without it every phase "
                        "but 8b-peer (its own call, its own file) runs, less --skip")
    multi_full.add_arguments(parser)
    parser.add_argument("--tag", default="", help="results file multi-<gpus>gpu-<tag>.json (one per set of phases)")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    if unknown := (skip | only) - set(PHASES):
        parser.error(f"--skip/--only: unknown phase(s) {','.join(sorted(unknown))}; known: {','.join(PHASES)}")
    args.skip_phases = set(PHASES) - only if only else skip | {"8b-peer"}
    multi_full.resolve_arguments(parser, args)
    args.lengths = sample_lengths(DOCS, seed=0, hi=MAX_DOC_TOKENS)
    return args


def main() -> None:
    args = parse_args()
    skip = args.skip_phases
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str]] = []
    result: dict[str, Any] = {"gpu_count": args.gpus, "docs": DOCS, "max_doc_tokens": MAX_DOC_TOKENS}

    result["disk_write_gbps"] = disk_write_gbps(args.out)
    rows.append(("disk write bandwidth", f"{result['disk_write_gbps']:.2f} GB/s"))
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, args.lengths, shape("llama3-8b")["vocab_size"])

    ckpt = args.out / "llama3-8b-random"
    if not {"8b", "naive", "8b-mfu"} <= skip:
        result["checkpoint_write_s"] = write_checkpoint(ckpt, shape("llama3-8b"))
        rows.append(("write 8B bf16 checkpoint", f"{result['checkpoint_write_s']:.1f} s"))
    if "naive" not in skip:
        naive = naive_loading(ckpt, args.gpus)
        result["naive_load"] = naive
        rows.append(("naive load: peak RSS per rank", f"{max(r['peak_rss_gib'] for r in naive):.1f} GiB, "
                     f"{max(r['seconds'] for r in naive):.0f} s"))
    if "8b" not in skip:
        bench_8b(args, ckpt, data, result, rows)
    if "scaling" not in skip:
        bench_scaling(args, data, result, rows)
    if "8b-mfu" not in skip:
        bench_8b_mfu(args, ckpt, data, result, rows)
    if "8b-fp8" not in skip:  # into this file, under fp8_8b (bench/multi/multi_fp8.py)
        multi_fp8.bench_8b_fp8(args, data, result, rows)
    if "8b-peer" not in skip:  # its own file, multi-<gpus>gpu-8b-full.json (bench/multi/multi_full.py)
        multi_full.bench_8b_peer(args, data, result["disk_write_gbps"], rows)

    if args.results and not set(PHASES) - {"8b-peer"} <= skip:  # 8b-peer writes a file of its own
        write_result(args.results / f"multi-{args.gpus}gpu{tagged(args)}.json", result)
    print("\n| measurement | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def bench_8b(args: argparse.Namespace, ckpt: Path, data: Path, result: dict, rows: list) -> None:
    run = args.out / "run-8b"
    save_at = args.steps8b - 2
    render(run, str(ckpt), data, args.gpus, ["--max_steps", str(args.steps8b), "--save_steps", str(save_at),
           "--gradient_checkpointing", "true", "--set", f"data.tokens_per_micro_batch={args.tokens8b}"])
    code, text = launch(run, args.gpus, 29600)
    result["8b_exit"] = code
    stats = run_stats(run, code, text, rows, "8B FSDP2 run", shape("llama3-8b"), args.gpus, args.lengths)
    if stats is None:
        return
    result["8b"] = stats
    loads = re.findall(r"rank (\d+) peak RSS: ([\d.]+) MiB before model load, ([\d.]+) MiB after \(([\d.]+) s\)", text)
    result["8b_load"] = [dict(rank=int(r), rss_before_mib=float(b), rss_after_mib=float(a), seconds=float(t))
                         for r, b, a, t in loads]
    finals = re.findall(r"rank (\d+) peak RSS ([\d.]+) MiB once sharded; model ready ([\d.]+) s", text)
    result["8b_peak_rss_mib"] = {int(r): float(m) for r, m, _ in finals}
    result["8b_model_ready_s"] = max((float(t) for _, _, t in finals), default=None)
    result["8b_log_tail"] = text[-2000:]
    rows.append(("8B FSDP2 tokens/s/GPU", f"{stats['real_tokens_per_s'] / args.gpus:,.0f}"))
    rows.append(("8B FSDP2 MFU (aggregate)", f"{(stats['mfu'] or 0) * 100:.1f}%"))
    rows.append(("8B peak GPU memory", f"{stats['peak_mem_gib']:.1f} GiB"))
    if result["8b_load"]:
        others = [x for x in result["8b_load"] if x["rank"] != 0]
        rows.append(("rank-0-only load: rank 0 time", f"{max(x['seconds'] for x in result['8b_load']):.0f} s"))
        rows.append(("rank-0-only load: ranks>0 peak RSS after load",
                     f"{max((x['rss_after_mib'] for x in others), default=0) / 1024:.2f} GiB"))
    if result["8b_model_ready_s"] is not None:
        rows.append(("8B load + shard (model ready)", f"{result['8b_model_ready_s']:.0f} s"))
    if result["8b_peak_rss_mib"]:
        rows.append(("peak RSS over the run, ranks>0",
                     f"{max((v for k, v in result['8b_peak_rss_mib'].items() if k), default=0) / 1024:.2f} GiB"))
    # Resume: drop the finished marker's later steps by running again with more steps.
    render(run, str(ckpt), data, args.gpus, ["--max_steps", str(args.steps8b + 2), "--save_steps", "1000000",
           "--gradient_checkpointing", "true", "--set", f"data.tokens_per_micro_batch={args.tokens8b}"])
    start = time.perf_counter()
    code, text2 = launch(run, args.gpus, 29601)
    result["8b_resume_total_s"] = time.perf_counter() - start
    result["8b_resume_log_tail"] = text2[-3000:]
    rows.append(("8B resume run (load + restore + 2 steps)", f"{result['8b_resume_total_s']:.0f} s, exit {code}"))
    saved = re.findall(r"checkpoint saved: \S+ \(([\d.]+) GB in ([\d.]+) s, ([\d.]+) GB/s\)", text)
    if saved:
        size, seconds, rate = map(float, saved[-1])
        result["8b_save"] = dict(gb=size, seconds=seconds, gbps=rate)
        rows.append(("8B sharded save", f"{size:.0f} GB in {seconds:.0f} s = {rate:.2f} GB/s "
                     f"(disk {result['disk_write_gbps']:.2f} GB/s)"))
    restored = re.findall(r"resumed from \S+ \(step [^)]*\) in ([\d.]+) s", text2)
    if restored:
        result["8b_restore_s"] = float(restored[-1])
        rows.append(("8B checkpoint restore (load_state)", f"{result['8b_restore_s']:.0f} s"))
    # The resume target is the measured wall time of the resumed run (`8b_resume_total_s`: process
    # start to exit, 2 steps included); the resumed run's own model-ready + restore times sit beside
    # it, from the same run's log (never added to numbers of another run).
    ready2 = re.findall(r"rank \d+ peak RSS [\d.]+ MiB once sharded; model ready ([\d.]+) s", text2)
    result["8b_resume_model_ready_s"] = max((float(t) for t in ready2), default=None)


def bench_8b_mfu(args: argparse.Namespace, ckpt: Path, data: Path, result: dict, rows: list) -> None:
    """8B throughput alone: compile, no activation checkpointing (fits at 8k tokens/GPU thanks to the
    fused loss), no saves."""
    run = args.out / "run-8b-mfu"
    compile_layers = not CPU_SMOKE  # compiling on CPU only slows the smoke run down
    render(run, str(ckpt), data, args.gpus, [
        "--max_steps", str(args.steps8b), "--save_steps", "1000000", "--gradient_checkpointing", "false",
        "--set", f"data.tokens_per_micro_batch={args.tokens8b_mfu}", "--set", f"train.compile={str(compile_layers).lower()}"])
    code, text = launch(run, args.gpus, 29620)
    stats = run_stats(run, code, text, rows, "8B MFU run (no checkpointing, compile)", shape("llama3-8b"), args.gpus,
                      args.lengths)
    if stats is None:
        return
    result["8b_mfu_run"] = dict(stats, tokens_per_micro_batch=args.tokens8b_mfu, compile=compile_layers, checkpointing=False)
    rows.append(("8B FSDP2 no-ckpt + compile: tokens/s/GPU", f"{stats['real_tokens_per_s'] / args.gpus:,.0f}"))
    rows.append(("8B FSDP2 no-ckpt + compile: MFU (aggregate)", f"{(stats['mfu'] or 0) * 100:.1f}%"))
    rows.append(("8B FSDP2 no-ckpt + compile: mean of per-step MFU", f"{(stats['mean_step_mfu'] or 0) * 100:.1f}%"))
    rows.append(("8B FSDP2 no-ckpt + compile: peak GPU memory", f"{stats['peak_mem_gib']:.1f} GiB"))


SCALING_STEPS, SCALING_SAVE_AT = 14, 10


def bench_scaling(args: argparse.Namespace, data: Path, result: dict, rows: list) -> None:
    """1B on 1 GPU and on --gpus GPUs, same tokens per GPU; the multi-GPU run saves a full checkpoint
    (model + optimizer, sharded) at step SCALING_SAVE_AT, timed on its own (the clock stops for it)."""
    per_gpu, runs = {}, {}
    for gpus in (1, args.gpus):
        run = args.out / f"run-1b-{gpus}gpu"
        save_at = SCALING_SAVE_AT if gpus > 1 else 1000000
        render(run, "llama3.2-1b", data, gpus, [
            "--max_steps", str(SCALING_STEPS), "--save_steps", str(save_at), "--gradient_checkpointing", "false",
            *random_weights(shape("llama3.2-1b")),
            "--set", f"data.tokens_per_micro_batch={args.tokens1b}", "--set", f"train.compile={str(not CPU_SMOKE).lower()}"])
        code, text = launch(run, gpus, 29610 + gpus)
        stats = run_stats(run, code, text, rows, f"1B on {gpus} GPU", shape("llama3.2-1b"), gpus, args.lengths)
        if stats is None:
            return
        runs[str(gpus)] = stats
        per_gpu[gpus] = stats["real_tokens_per_s"] / gpus
        rows.append((f"1B tokens/s/GPU on {gpus} GPU", f"{per_gpu[gpus]:,.0f} (MFU {(stats['mfu'] or 0) * 100:.1f}% "
                     f"aggregate, {(stats['mean_step_mfu'] or 0) * 100:.1f}% mean of steps)"))
        if gpus > 1 and (saved := save_line(text)):
            result["save_1b"] = dict(saved, gpu_count=gpus, step=SCALING_SAVE_AT)
            rows.append((f"1B full checkpoint save inside the {gpus}-GPU run",
                         f"{saved['gb']:.1f} GB in {saved['seconds']:.1f} s = {saved['gbps']:.2f} GB/s"))
    result["scaling_1b"] = runs
    result["weak_scaling_efficiency"] = per_gpu[args.gpus] / per_gpu[1]
    rows.append((f"1B weak scaling 1 -> {args.gpus} GPUs", f"{result['weak_scaling_efficiency'] * 100:.0f}%"))


if __name__ == "__main__":
    main()
