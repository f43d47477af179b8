"""The training pause of a checkpoint save, synchronous against asynchronous, in one call on one GPU or more (#53).

    python -m bench.multi.gpu_save_async --out /tmp/save-async --results bench/results/h200/<dated-folder>
    ... --gpus 4 --runs async,resume   # 8B on 4 GPUs (as many layers as the disk holds): where its resume goes
    BENCH_CPU_SMOKE=1 python -m bench.multi.gpu_save_async --out /tmp/save-async-smoke   # CPU, tiny: the plumbing
    ... --staging disk   # the async run staged on --out's disk (train.async_save_staging), copied in the background

By default one process, FSDP2 over one GPU (the launcher's rendering for --nodes 1, as gpu_multi runs it), random
weights of the Llama-3-8B layer shape with as many decoder layers as the disk under --out can hold two
checkpoints of (the newest complete one and the one in flight; save_total_limit = 1), at most 32 (8B):
on a 64 GiB disk ~5 layers, ~2.1B parameters, ~26 GB of state: the state one rank holds in the 8B run
on 4 GPUs (96.4 GB / 4). The pause of an asynchronous save is this rank's copy to pinned CPU memory,
so it is the 8B-on-4-GPUs pause; the write GB/s is this disk's.

Four runs, same data, --steps steps each, --gpus GPUs (1 by default; more: FSDP2 over them, the launcher's
rendering for 2 nodes of half as many, each rank's state a 1/N share of the model's):
  nosave   no checkpoint: the MFU baseline;
  async    a save every --save-every steps, train.async_save = true;
  resume   the async run's directory started again (a requeue): job start -> first step is `resume_s`, and
           `resume_phases` the seconds of each startup phase (imports, process group, data, model build,
           prepare, checkpoint load, first step...: train/observe/startup.py's record, same origin);
  sync     as async with train.async_save = false.
MFU with saves counts the save pauses as wall time (metrics' elapsed_s leaves them out; the
"checkpoint" records give them); the steps slowed by a write in flight are in elapsed_s already.
Results `save-async.json` (results_io.write_result, again after every run: a call cut off by its time limit keeps
the runs that finished): `save_pause_s` (async and sync, per save),
`write_gbps`, `mfu` per run, `step_s_median` and `step_s_median_writing` (the steps begun while a write was in
flight: whether the write slows training, free of the window differences a shorter nosave run has), `resume_s`,
`resume_phases`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.multi import gpu_multi
from bench.suites.gpu_single import TINY
from bench.report.results_io import throughput_numbers, write_result
from bench.common.synthetic import SHAPES, write_token_jsonl
from contract.protocol import JOB_START_ENV
from contract.shape import ModelShape

LAYER_PARAMS_8B = 218_112_000  # one Llama-3-8B decoder layer (attention 4096x(4096+1024+1024+4096), MLP 3x4096x14336, norms)
STATE_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two moments (launcher/plan/saves.py checkpoint_bytes)
DISK_SHARE = 0.8  # of the free space, what two checkpoints may take


def arch_for_disk(out: Path) -> dict:
    """The 8B layer shape with as many layers as two checkpoints on `out`'s disk allow (1..32)."""
    base = dict(SHAPES["llama3-8b"])
    if gpu_multi.CPU_SMOKE:
        return dict(TINY)
    embeddings = 2 * base["vocab_size"] * base["hidden_size"]
    free = shutil.disk_usage(out).free
    layers = int((DISK_SHARE * free / 2 / STATE_BYTES_PER_PARAM - embeddings) // LAYER_PARAMS_8B)
    if layers < 1:
        raise SystemExit(f"{out}: {free / 1e9:.0f} GB free, too little for two checkpoints of one 8B layer")
    return dict(base, num_hidden_layers=min(32, layers))


def run_once(name: str, args: argparse.Namespace, arch: dict, data: Path, extra: list[str], port: int,
             run: Path | None = None) -> tuple[Path, int, str, float]:
    """Render (unless `run` exists: a restart of it) and launch; returns (run dir, exit code, log, start time)."""
    if run is None:
        run = args.out / f"run-{name}"
        shutil.rmtree(run, ignore_errors=True)
        steps = args.nosave_steps if name == "nosave" and args.nosave_steps else args.steps
        gpu_multi.render(run, "llama3-8b", data, args.gpus, [
            "--max_steps", str(steps), "--gradient_checkpointing", "true",
            *gpu_multi.random_weights(arch, sharded=True),
            "--set", f"data.tokens_per_micro_batch={args.tokens}", "--set", "train.save_total_limit=1",
            "--set", f"train.gradient_accumulation_steps={args.accumulate}",
            "--set", f"train.compile={str(not gpu_multi.CPU_SMOKE).lower()}", *extra])
    started = time.time()
    # One compile cache for every run of the call: only the first compiles cold (a requeue finds its own
    # run directory's cache the same way, contract.protocol.COMPILE_CACHE_DIR). The job's start, as the
    # batch script exports it: the ranks' startup record counts from it.
    env = {"TORCHINDUCTOR_CACHE_DIR": str(args.out / "compile-cache"), JOB_START_ENV: repr(started)}
    code, text = gpu_multi.launch(run, args.gpus, port, args.run_timeout, env)
    return run, code, text, started


def metrics_records(run: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl records, in the order they were written (a resume appends to the same file)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def events(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    """The records of one event kind ("checkpoint": train/engine/checkpoint.py's step, mode, save_pause_s, write_s,
    gb; "startup": train/observe/startup.py's phases)."""
    return [r for r in records if r.get("event") == event]


def startup_phases(run: Path) -> dict[str, float] | None:
    """The seconds of each startup phase of the run's newest start (its "startup" metrics record), or None."""
    startups = events(metrics_records(run), "startup")
    return startups[-1]["phases"] if startups else None


def step_medians(records: list[dict[str, Any]], warmup_steps: int,
                 saves: list[dict[str, Any]]) -> dict[str, float | None]:
    """The median seconds of a timed step (metrics' elapsed_s between step records: training time, pauses left out),
    and of the steps that ran while an asynchronous write was in flight (begun within `write_s` of the save's step):
    the direct test of "a write does not slow training". None where no step qualifies. The run's first start only
    (its records up to the first "done")."""
    done = next((i for i, r in enumerate(records) if r.get("event") == "done"), len(records))
    elapsed = {r["step"]: r["elapsed_s"] for r in records[:done] if "loss" in r and "elapsed_s" in r}
    steps = sorted(elapsed)
    seconds = {b: (elapsed[b] - elapsed[a]) / (b - a) for a, b in zip(steps, steps[1:]) if a >= warmup_steps}
    writing = {step for save in saves if save["mode"] == "async" and save["step"] in elapsed for step in seconds
               if step > save["step"] and elapsed[step] - seconds[step] - elapsed[save["step"]] < save["write_s"]}
    return {"step_s_median": statistics.median(seconds.values()) if seconds else None,
            "step_s_median_writing": statistics.median(seconds[s] for s in writing) if writing else None}


def mfu_with_pauses(run: Path, code: int, text: str, rows: list, label: str, arch: dict, lengths: list[int],
                    gpus: int) -> dict | None:
    """gpu_multi.run_stats, and the MFU once the save pauses inside the timed window count as wall time."""
    stats = gpu_multi.run_stats(run, code, text, rows, label, arch, gpus, lengths)
    if stats is None:
        return None
    records = metrics_records(run)
    saves = events(records, "checkpoint")
    paused = sum(c["save_pause_s"] for c in saves if c["step"] > stats["warmup_steps"])
    wall = stats["seconds"] + paused
    with_pauses = throughput_numbers(arch, lengths, stats["real_tokens"] / wall, gpus, stats["peak_flops"])
    stats.update(save_pause_total_s=paused, mfu_with_pauses=with_pauses.get("mfu"), saves=saves,
                 **step_medians(records, stats["warmup_steps"], saves))
    return stats


def first_step_s(text: str, started: float) -> float | None:
    """Seconds from `started` (epoch) to the first "step N/M" line of the log (its asctime, local time)."""
    found = re.search(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \[rank 0\] INFO train\.observe\.metrics: step \d+/",
                      text, re.MULTILINE)
    if not found:
        return None
    stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(found.group(2)) / 1000
    return stamp - started


def summarized(stats: dict | None, name: str, rows: list) -> dict | None:
    """A run's stats with its pause per save and write GB/s (and their table rows)."""
    if not stats:
        return stats
    pauses = [c["save_pause_s"] for c in stats["saves"]]
    rates = [c["gb"] / c["write_s"] for c in stats["saves"] if c["write_s"]]
    stats.update(save_pause_s=pauses, write_gbps=rates)
    rows.append((f"{name}: MFU (saves' pauses counted)", f"{(stats['mfu'] or 0) * 100:.1f}% "
                 f"({(stats['mfu_with_pauses'] or 0) * 100:.1f}%)"))
    if stats["step_s_median"] is not None:
        writing = stats["step_s_median_writing"]
        rows.append((f"{name}: median step (while a write is in flight)", f"{stats['step_s_median']:.3f} s"
                     + ("" if writing is None else f" ({writing:.3f} s)")))
    if pauses:
        rows.append((f"{name}: pause per save, write GB/s",
                     f"{', '.join(f'{p:.2f}' for p in pauses)} s; {', '.join(f'{r:.2f}' for r in rates)} GB/s"))
    return stats


def resume(args: argparse.Namespace, arch: dict, data: Path, result: dict[str, Any], rows: list) -> None:
    """The async run's directory started again (a requeue): job start -> first step, load_state, the phases."""
    run = args.out / "run-async"
    _, code, text, started = run_once("resume", args, arch, data, [], 29660, run=run)
    result["resume_exit"] = code
    result["resume_s"] = first_step_s(text, started)
    restored = re.findall(r"resumed from \S+ \(step [^)]*\) in ([\d.]+) s", text)
    result["resume_restore_s"] = float(restored[-1]) if restored else None
    result["resume_phases"] = startup_phases(run)
    rows.append(("resume: job start -> first step", f"{result['resume_s'] or float('nan'):.1f} s "
                 f"(load_state {result['resume_restore_s'] or float('nan'):.1f} s), exit {code}"))
    rows += [(f"resume: {phase}", f"{seconds:.1f} s") for phase, seconds in (result["resume_phases"] or {}).items()]
    shutil.rmtree(run / "checkpoints", ignore_errors=True)  # room for the sync run's


def written(args: argparse.Namespace, result: dict[str, Any]) -> None:
    if args.results:
        write_result(args.results / "save-async.json", result)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("/tmp/save-async"))
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of this host the runs shard over (FSDP2)")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=6 if gpu_multi.CPU_SMOKE else 50)
    # The baseline needs no save interval, only steady steps: fewer of them keep the four runs in one call's time
    # (the 2026-12-06 call, 42 steps each, ran past its 580 s in the resume run).
    parser.add_argument("--nosave-steps", type=int, default=0, help="steps of the nosave run (0: --steps)")
    parser.add_argument("--save-every", type=int, default=2 if gpu_multi.CPU_SMOKE else 20)
    parser.add_argument("--tokens", type=int, default=256 if gpu_multi.CPU_SMOKE else 32768)
    # Micro-batches per step: the time between saves must be the real run's. A rank of the 8B on 4 GPUs computes 32
    # layers of 32,768 tokens a step, ~6.4x what these 5 layers take; 4 keeps the interval on the short side. With 1,
    # a save every 20 steps came every 15 s on one H100 (less than any disk needs for 25.7 GB); 131,072 tokens in one
    # micro-batch ran out of its 80 GB (2026-12-06).
    parser.add_argument("--accumulate", type=int, default=1 if gpu_multi.CPU_SMOKE else 4)
    parser.add_argument("--run-timeout", type=float, default=300)
    parser.add_argument("--runs", default="nosave,async,resume,sync", help="which of the four runs (resume needs async)")
    parser.add_argument("--staging", choices=("auto", "memory", "disk"), default="auto",
                        help="train.async_save_staging of the async run (disk: the shard written to --out's disk in "
                             "the pause, copied to the checkpoint directory in the background)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    arch = arch_for_disk(args.out)
    lengths = gpu_multi.sample_lengths(gpu_multi.DOCS, seed=0, hi=gpu_multi.MAX_DOC_TOKENS)
    data = args.out / "docs.jsonl"
    write_token_jsonl(data, lengths, arch["vocab_size"])
    rows: list[tuple[str, str]] = []
    result: dict[str, Any] = {"arch": arch, "gpu_count": args.gpus, "steps": args.steps, "save_every": args.save_every,
                              "tokens_per_micro_batch": args.tokens, "gradient_accumulation_steps": args.accumulate,
                              "docs": gpu_multi.DOCS,
                              "max_doc_tokens": gpu_multi.MAX_DOC_TOKENS, "staging": args.staging,
                              "disk_write_gbps": gpu_multi.disk_write_gbps(args.out)}
    result["state_gb"] = STATE_BYTES_PER_PARAM * ModelShape.from_arch(arch).total_params / 1e9
    rows.append(("shape", f"{arch['num_hidden_layers']} layers of {arch['hidden_size']} wide, "
                 f"state {result['state_gb']:.1f} GB (fp32 weights + AdamW moments)"))
    rows.append(("disk write (dd-like)", f"{result['disk_write_gbps']:.2f} GB/s"))
    saves = ["--save_steps", str(args.save_every)]
    runs = args.runs.split(",")

    def train(name: str, extra: list[str], port: int) -> None:
        seen = len(rows)
        run, code, text, _ = run_once(name, args, arch, data, extra, port)
        result[name] = summarized(mfu_with_pauses(run, code, text, rows, name, arch, lengths, args.gpus), name, rows)
        written(args, result)  # after every run: a call cut off by its limit keeps what landed (2026-12-06)
        print("\n".join(f"{label}: {value}" for label, value in rows[seen:]), flush=True)  # progress, run by run

    if "nosave" in runs:
        train("nosave", ["--save_steps", "1000000"], 29650)
    if "async" in runs:
        train("async", [*saves, "--set", "train.async_save=true", "--set", f"train.async_save_staging={args.staging}",
                        "--set", f"profile.node_local_dir={args.out / 'node-local'}"], 29651)
    if result.get("async") and "resume" in runs:
        resume(args, arch, data, result, rows)
        written(args, result)
    if "sync" in runs:
        train("sync", [*saves, "--set", "train.async_save=false"], 29670)
    print("\n| measurement | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
