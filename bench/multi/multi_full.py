"""Phase `8b-peer` of bench/multi/gpu_multi.py (issue #29 items 1 and 2): 8B full fine-tuning on all GPUs of
the host, ours against the peer a user would pick, same documents and tokens per GPU, one call.

    python -m bench.multi.gpu_multi --gpus 4 --only 8b-peer --repeat 3 --results DIR   # multi-4gpu-8b-full.json

--repeat N (default 3; 1 where one side runs, or on CPU where the peer cannot build its model) runs each side N
times, alternating from the peer, a peer run more than 15% below the peer's median once more, and records every
run (ours' windows, recompiles and save; the peer's step times) under `sides` with the median ratio and its range
(bench/report/distribution.py). --repeat 1 writes one run a side under `8b_full` / `8b_full_peer`.

- Ours: rendered by `sft-launch` and started as a 2-node job (bench/multi/gpu_multi.py: 2 machines x G/2
  processes): FSDP2, compiled layers, no activation checkpointing (unless --checkpointing8b-full: both
  sides with it from the start, for 2 GPUs), --tokens8b-full tokens per GPU, random
  weights drawn per shard on the GPUs after FSDP2 shards a meta model (model.init = sharded: a CPU draw
  of the whole 8B model on every rank did not finish in 155 s on 4 H100s' host; `model_ready_s` records
  what it took), --steps8b-full optimizer steps and exactly one full checkpoint save (model +
  optimizer, sharded) after the warm-up, at step SAVE_FRACTION of the run. The run's clock stops for the
  save (train/engine/loop.py: the save sits between a settle and a lap), so `real_tokens_per_s` and `mfu`
  are over the steps alone; `with_save` books the logged save seconds too. TORCH_LOGS=recompiles for its
  processes: every recompile and its reason is in the results (`recompiles`), with the per-window timings
  of metrics.jsonl (`windows`) to find a window that stalled. The checkpoint is deleted once measured.
- Peer: TRL's SFTTrainer under `accelerate launch` with FSDP2 (bench/peers/peer_fsdp.py, bench/peers/peer_trl.py):
  fp32 weights with bf16 autocast, BFD padding-free packing, flex attention, Liger, fused AdamW, no
  gradient checkpointing; when that does not fit the GPUs it starts again with gradient checkpointing
  inside its time limit (`gradient_checkpointing`, `fallback_reason` say which ran and why).
  torch_compile is off unless --peer-compile: it gave 1.00x on one H100 (BENCHMARKS.md, single-1b) and a
  whole-model compile of 8B would eat the call's time.
Each run runs under its side's wall-clock limit (run_logged kills the whole process tree). The results
file is rewritten after each run, so a call cut short keeps the runs it finished.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path
from typing import Any

from bench.multi import host
from bench.suites.gpu_single import device_peak, windows  # windows: also multi_fp8's
from bench.common.processes import TIMED_OUT
from bench.peers.peer_fsdp import run_peer
from bench.report import distribution
from bench.report.results_io import WARMUP_STEPS, throughput_numbers, write_result
from contract import protocol
from contract.config import load_train_config
from contract.shape import ModelShape
from train.main import CUDA_ALLOC_CONF

SHAPE = "llama3-8b"
SAVE_FRACTION = 2 / 3  # the one save: after the warm-up, with a third of the steps left to show its after-effects
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments (the sharded save's bulk)
NO_SAVE_STEP = 1_000_000  # --save_steps past any run here: --no-save8b-full's run saves nothing
RECOMPILE_LINES = 80  # of TORCH_LOGS=recompiles' output kept in the results (all of it stays in machine*.log)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps8b-full", type=int, default=46, help="8b-peer: optimizer steps on each side")
    parser.add_argument("--tokens8b-full", type=int, default=8192, help="8b-peer: packed tokens per GPU per step")
    parser.add_argument("--ours-timeout", type=float, default=300, help="8b-peer: our side's wall-clock limit (s)")
    parser.add_argument("--peer-timeout", type=float, default=240,
                        help="8b-peer: the peer's wall-clock limit (s), its fall-back run included")
    parser.add_argument("--peer-compile", action="store_true", help="8b-peer: the peer with torch_compile")
    parser.add_argument("--sides8b-full", default="ours,peer", type=_sides,
                        help="8b-peer: which sides run, comma list of ours,peer (an A/B of our settings runs "
                             "ours alone under each, the peer once)")
    parser.add_argument("--ours-set", action="append", default=[], metavar="KEY=VALUE",
                        help="8b-peer: a train.toml override for our run (sft-launch --set), e.g. "
                             "train.profile_steps=30:32 for a profile of two steps in the log")
    parser.add_argument("--checkpointing8b-full", action="store_true",
                        help="8b-peer: both sides with activation checkpointing from the start (8B on 2 × 80 GB "
                             "GPUs does not fit without it)")
    parser.add_argument("--no-save8b-full", action="store_true",
                        help="8b-peer: our run without its one timed save (an A/B of step speed alone)")
    parser.add_argument("--repeat", type=int, default=None,
                        help=f"8b-peer: runs a side, alternating from the peer (default {distribution.RUNS_PER_SIDE} "
                             "with both sides on GPUs, else 1; 1: the one-run-a-side file)")


def resolve_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--repeat's default, or its usage error (bench/report/distribution.py's repeat_of)."""
    args.repeat = distribution.repeat_of(parser, args.repeat, args.sides8b_full == {"ours", "peer"}, host.CPU_SMOKE)


def _sides(text: str) -> set[str]:
    sides = set(text.split(","))
    if not sides <= {"ours", "peer"}:
        raise argparse.ArgumentTypeError(f"ours and/or peer, not {text!r}")
    return sides


def save_step(steps: int) -> int:
    """The step of the run's only save: after the warm-up, and twice it lies past the last step."""
    step = int(steps * SAVE_FRACTION)
    assert WARMUP_STEPS < step < steps < 2 * step, f"{steps} steps leave no room for one timed save"
    return step


def recompiles(text: str) -> list[str]:
    """TORCH_LOGS=recompiles' lines (what was recompiled and the guard that failed), every rank's."""
    return [line.strip() for line in text.splitlines() if "[__recompiles" in line][:RECOMPILE_LINES]


def kernels(text: str) -> dict[str, Any]:
    """What our run chose, from its log: the attention backend for packed batches, and whether the fused
    SwiGLU MLP ran (quack's kernels come with flash-attn-4; FP8 keeps it off)."""
    attention = re.search(r"attention: (\S+) for packed batches", text)
    mlp = re.search(r"fused SwiGLU MLP (\(quack GEMMs\)|off)", text)
    return {"attention": attention.group(1) if attention else None,
            "fused_mlp": mlp.group(1) != "off" if mlp else None}


def allocator_setting(default: str) -> str:
    """The CUDA caching allocator's setting a side ran with: the environment's, else the side's own default
    (train's CUDA_ALLOC_CONF for ours; "" = torch's default for the peer)."""
    return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or default


def free_disk(run: Path) -> None:
    """Remove the checkpoint our run wrote (~96 GB at 8B: model and optimizer), so the peer finds the
    disk as we did (run.export_dir = "": no end-of-run export)."""
    shutil.rmtree(run / protocol.CHECKPOINT_DIR, ignore_errors=True)


def numbered(name: str, index: int | None) -> str:
    """A run's folder: `name` for the one run of --repeat 1, name-<index> for run `index` of a side."""
    return name if index is None else f"{name}-{index}"


def ours(args: argparse.Namespace, data: Path, arch: dict, index: int | None = None) -> dict[str, Any]:
    run = args.out / numbered("run-8b-full", index)
    shutil.rmtree(run, ignore_errors=True)  # a run of an earlier call would be resumed, its metrics appended to
    at = NO_SAVE_STEP if args.no_save8b_full else save_step(args.steps8b_full)
    host.render(run, SHAPE, data, args.gpus, [
        "--max_steps", str(args.steps8b_full), "--save_steps", str(at),
        "--gradient_checkpointing", str(args.checkpointing8b_full).lower(),
        *host.random_weights(arch, sharded=True),
        "--set", f"data.tokens_per_micro_batch={args.tokens8b_full}",
        "--set", f"train.compile={str(not host.CPU_SMOKE).lower()}",
        *(arg for setting in args.ours_set for arg in ("--set", setting))])
    code, text = host.launch(run, args.gpus, 29640 + (index or 0), args.ours_timeout, {"TORCH_LOGS": "recompiles"})
    free_disk(run)
    if code != 0:
        print(text[-4000:])
        return failed(run, f"timeout {args.ours_timeout:.0f} s" if code == TIMED_OUT else f"exit {code}")
    stats = host.run_stats(run, 0, text, [], "", arch, args.gpus, args.lengths)
    saved = host.save_line(text)
    ready = re.findall(r"model ready ([\d.]+) s", text)
    block = {"path": "ours-8b-full", **stats, "tokens_per_micro_batch": args.tokens8b_full, "compile": not host.CPU_SMOKE,
             "gradient_checkpointing": args.checkpointing8b_full, "model_ready_s": max(map(float, ready), default=None),
             "windows": windows(run / "metrics.jsonl"), "recompiles": recompiles(text),
             "alloc_conf": allocator_setting(CUDA_ALLOC_CONF), "kernels": kernels(text),
             "precision": load_train_config(run / protocol.TRAIN_CONFIG).train.precision}
    if saved:
        block["save"] = {**saved, "step": at}
        seconds = stats["seconds"] + saved["seconds"]
        block["with_save"] = {"seconds": seconds, "real_tokens_per_s": stats["real_tokens"] / seconds,
                              "mfu": throughput_numbers(arch, args.lengths, stats["real_tokens"] / seconds, args.gpus,
                                                        stats["peak_flops"])["mfu"]}
    return block


def failed(run: Path, why: str) -> dict[str, Any]:
    """A run of ours that did not finish: why, and the windows it logged before (a run cut after its
    thirtieth step still measured thirty steps)."""
    metrics = run / "metrics.jsonl"
    return {"error": why, "windows": windows(metrics) if metrics.is_file() else []}


def peer(args: argparse.Namespace, data: Path, arch: dict, index: int | None = None) -> dict[str, Any]:
    side = run_peer(args.out / numbered("peer-trl-full", index), args.gpus, [
        "--data", str(data), "--shape", SHAPE, "--max-length", str(args.tokens8b_full),
        "--max-steps", str(args.steps8b_full), *(["--compile"] if args.peer_compile else [])],
        args.peer_timeout, checkpointing_fallback=True, checkpointing=args.checkpointing8b_full)
    if isinstance(side, str):  # the peer's own clock: no windows of ours to keep
        return {"error": side, "windows": []}
    peak = device_peak()[1]
    return {**side, "gpu_count": args.gpus, "peak_flops": peak, "alloc_conf": allocator_setting(""),
            **throughput_numbers(arch, args.lengths, side["real_tokens_per_s"], args.gpus, peak)}


def bench_8b_peer(args: argparse.Namespace, data: Path, disk_gbps: float, rows: list) -> dict[str, Any]:
    """Both sides, ours first (--repeat N > 1: compare_8b_peer); the record (also written to
    multi-<gpus>gpu-8b-full.json after each side)."""
    arch = host.shape(SHAPE)
    record: dict[str, Any] = {"gpu_count": args.gpus, "docs": host.DOCS, "max_doc_tokens": host.MAX_DOC_TOKENS,
                              "shape": "tiny" if host.CPU_SMOKE else SHAPE, "tokens_per_gpu": args.tokens8b_full,
                              "max_steps": args.steps8b_full, "disk_write_gbps": disk_gbps}
    record["expected_save_gb"] = ModelShape.from_arch(arch).total_params * CHECKPOINT_BYTES_PER_PARAM / 1e9
    record["expected_save_s"] = record["expected_save_gb"] / disk_gbps
    print(f"8b-peer: our save writes ~{record['expected_save_gb']:.0f} GB; at the measured {disk_gbps:.2f} GB/s "
          f"~{record['expected_save_s']:.0f} s of our {args.ours_timeout:.0f} s limit", flush=True)
    if args.repeat > 1:
        return compare_8b_peer(args, data, arch, record, rows)
    for key, side in (("8b_full", ours), ("8b_full_peer", peer)):
        if side.__name__ not in args.sides8b_full:
            continue
        found = side(args, data, arch)
        if "error" in found:
            record[f"{key}_error"] = found["error"]
            if found["windows"]:
                record[f"{key}_windows_before_error"] = found["windows"]
        else:
            record[key] = found
        summarize(record)
        if args.results:
            write_result(args.results / result_name(args), record)
    rows.extend(table_rows(record, args.gpus))
    return record


def compare_8b_peer(args: argparse.Namespace, data: Path, arch: dict, record: dict[str, Any],
                    rows: list) -> dict[str, Any]:
    """--repeat N runs a side, alternating from the peer, every run recorded (bench/report/distribution.py); the
    results file is rewritten after each run."""
    def written(fields: dict[str, Any]) -> None:
        if args.results:
            write_result(args.results / result_name(args), {**record, **fields})

    checkpointing = {"gradient_checkpointing": args.checkpointing8b_full}
    record.update(distribution.compare(
        args.repeat, lambda index: peer(args, data, arch, index), lambda index: ours(args, data, arch, index),
        {"path": "ours-8b-full", **checkpointing}, {"path": "peer-trl" + "-compile" * args.peer_compile, **checkpointing},
        written))
    rows.extend(compare_rows(record, args.gpus, "8B full FT", "TRL+FSDP2"))
    return record


def compare_rows(record: dict[str, Any], gpus: int, what: str, peer_name: str) -> list[tuple[str, str]]:
    """A --repeat file's table rows: each run in the order it ran, then the figure (bench/multi/gpu_multi_lora.py's too)."""
    rows, seen = [], {"ours": 0, "peer": 0}
    for side in record["order"]:
        run = record["sides"][side]["runs"][seen[side]]
        seen[side] += 1
        label = f"{what} {side} run {seen[side]}" + (" (re-run below)" if "rerun_as" in run else "")
        rows.append((label, run["error"] if "error" in run else f"{run['real_tokens_per_s'] / gpus:,.0f} tokens/s/GPU"))
    if record["ratio_median"] is not None:
        rows.append((f"{what} ours / {peer_name} real tokens/s", distribution.ratio_cell(record)))
    return rows


def result_name(args: argparse.Namespace) -> str:
    """multi-<gpus>gpu-8b-full.json, -<tag> before .json with gpu_multi's --tag (an A/B writes one file a side)."""
    return f"multi-{args.gpus}gpu-8b-full{host.tagged(args)}.json"


def summarize(record: dict[str, Any]) -> None:
    """The issue's top-level fields: ours' steps and aggregate MFU (the per-step mean beside it), the peer
    and the ratio of real tokens/s."""
    ours_side, peer_side = record.get("8b_full"), record.get("8b_full_peer")
    if ours_side:
        record.update(steps=ours_side["steps"], mfu=ours_side["mfu"], mean_step_mfu=ours_side["mean_step_mfu"])
    if peer_side:
        record["peer"] = peer_side["path"]
    if ours_side and peer_side:
        record["ratio_vs_peer"] = ours_side["real_tokens_per_s"] / peer_side["real_tokens_per_s"]


def table_rows(record: dict[str, Any], gpus: int) -> list[tuple[str, str]]:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 100:.1f}%"

    rows = []
    if ours_side := record.get("8b_full"):
        rows.append((f"8B full FT ours ({ours_side['steps']} steps): tokens/s/GPU, MFU aggregate, mean of steps",
                     f"{ours_side['real_tokens_per_s'] / gpus:,.0f}, {pct(ours_side['mfu'])}, "
                     f"{pct(ours_side['mean_step_mfu'])}"))
        if save := ours_side.get("save"):
            rows.append((f"8B full checkpoint save at step {save['step']}",
                         f"{save['gb']:.1f} GB in {save['seconds']:.1f} s = {save['gbps']:.2f} GB/s"))
            rows.append(("8B ours MFU with the save's seconds", pct(ours_side["with_save"]["mfu"])))
        rows.append(("8B ours: recompiles after first log, TORCH_LOGS lines",
                     f"{ours_side['recompiles_after_first_log']}, {len(ours_side['recompiles'])}"))
    if peer_side := record.get("8b_full_peer"):
        how = "with gradient checkpointing (fall-back)" if peer_side["gradient_checkpointing"] else "no checkpointing"
        rows.append((f"8B full FT {peer_side['path']} ({how}): tokens/s/GPU, MFU",
                     f"{peer_side['real_tokens_per_s'] / gpus:,.0f}, {pct(peer_side['mfu'])}"))
    for key in ("8b_full_error", "8b_full_peer_error"):
        if key in record:
            rows.append((key, record[key]))
    if "ratio_vs_peer" in record:
        rows.append(("8B full FT ours / TRL+FSDP2 real tokens/s", f"{record['ratio_vs_peer']:.2f}x (target >= 1.3x)"))
    return rows
