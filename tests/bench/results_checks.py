"""Consistency checks of one results file beyond re-deriving its numbers (issue #51 item 3), for
tests/bench/test_results.py: each returns the problems it finds as lines (empty: none), so a test can
run it on a committed file and on a tampered in-memory copy alike. Also the committed files (FILES, of_kind)
and how a test names and loads one, shared with tests/bench/test_results_kinds.py.

- windows: the timed windows (logged steps past the clock's start) sum to the run's seconds and real tokens;
- token slots: real tokens <= timed steps x tokens per micro-batch x micro-batches per step x GPUs;
- comparison: the two sides of a comparison timed the same number of steps, with the same tokens per step and
  the same activation checkpointing, unless the file records why not (`difference_reason`) or ALLOWED does;
- MFU mean: `mean_step_mfu` is the mean over exactly the timed windows, the ones the aggregate counts;
- saves (save-async.json): each save's pause and write rate, the MFU with the pauses counted, the resume;
- speed: each run's `speed_error` is its recorded prediction over its measured rate, less one (issue #55).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common.synthetic import SHAPES, document_lengths, sample_lengths
from bench.report import distribution
from bench.report.results_io import RESULTS, ROOT, clock_start, throughput_numbers
from bench.report.speed_inputs import SAVE_RUNS, runs_of


def run_cpu_smoke(module: str, tmp_path: Path) -> tuple[Path, str]:
    """`python -m MODULE --cpu-smoke` into tmp_path/out: (the folder of its results files, its stdout); fails with
    the script's output unless it exits 0."""
    out, results = tmp_path / "out", tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", module, "--cpu-smoke", "--out", str(out), "--results", str(results)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return results, proc.stdout
from bench.suites.gpu_single import VARIANTS

REL = 1e-9  # JSON floats round-trip exactly; this only absorbs a different order of float operations
FILES = sorted(RESULTS.rglob("*.json"))  # every committed results file

# Files written before these checks existed whose sides differ, or whose MFU mean holds other windows, and
# why: keyed by (file under bench/results, check). Results files are never edited; a new file records
# `difference_reason` itself (bench/report/distribution.py).
ALLOWED: dict[tuple[str, str], str] = {
    ("h100/four-gpu-2026-11-27/multi-4gpu-fp8.json", "comparison"):
        "fp8_8b's bf16 side is the call's 8b-peer run of ours (--fp8-baseline: 42 timed steps with a save inside), "
        "its FP8 side a 20-step run (16 timed, no save); BENCHMARKS.md's fp8-8b-4gpu table lists both step counts",
    ("h100/four-gpu-2026-11-27f/multi-4gpu-8b-full-log10-t10240-nosave.json", "mfu mean"):
        "written before 2026-11-27's fix: mean_step_mfu over the windows past warmup_steps (4) while the clock of a "
        "run logging every 10 steps starts at step 10, so the mean holds the compile window (tests/bench/"
        "test_results_kinds.py check_8b_full re-derives it as written)",
}


def result_id(path: Path) -> str:
    """A results file as the test ids and messages name it: its path under bench/results."""
    return str(path.relative_to(RESULTS))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def of_kind(*kinds: str) -> list[Path]:
    """The committed files of these kinds: a file's kind is its name up to the first '-' (single-..., multi-...)."""
    return [p for p in FILES if p.name.split("-")[0] in kinds]


def close(recorded: float | None, derived: float | None, what: str, name: str) -> None:
    if derived is None:
        assert recorded is None, f"{name}: {what} = {recorded}, but nothing to derive it from"
        return
    assert recorded == pytest.approx(derived, rel=REL), f"{name}: {what} = {recorded}, re-derived {derived}"


def check_run_block(block: dict, arch: dict, lengths: list[int], name: str) -> None:
    """A run's rate from its raw tokens and seconds; its FLOP count, TFLOP/s and MFU from the rate."""
    close(block["real_tokens_per_s"], block["real_tokens"] / block["seconds"], "real_tokens_per_s", name)
    derived = throughput_numbers(arch, lengths, block["real_tokens_per_s"], block["gpu_count"], block["peak_flops"],
                                 block.get("lora_params"))
    for key in ("flops_per_token", "tflops_per_gpu", "mfu"):
        close(block[key], derived[key], key, name)


def _timed(windows: list[dict]) -> tuple[int, list[dict]]:
    start = clock_start(w["step"] for w in windows)
    return start, [w for w in windows if w["step"] > start]


def window_problems(block: dict[str, Any]) -> list[str]:
    """A run that lists its logged windows: their seconds and real tokens (tokens/s x seconds) over the
    timed ones are the run's totals (round: steady_state rounds the tokens)."""
    if not block.get("windows"):
        return []
    _, timed = _timed(block["windows"])
    seconds = sum(w["seconds"] for w in timed)
    tokens = sum(w["tokens_per_s"] * w["seconds"] for w in timed)
    problems = []
    if abs(seconds - block["seconds"]) > REL * max(1.0, seconds):
        problems.append(f"timed windows' seconds sum to {seconds}, the run says {block['seconds']}")
    if abs(tokens - block["real_tokens"]) > 1 + REL * tokens:
        problems.append(f"timed windows' real tokens sum to {tokens:.0f}, the run says {block['real_tokens']}")
    return problems


def step_time_problems(run: dict[str, Any]) -> list[str]:
    """A run that lists each timed step's seconds (a peer's clock, bench/peers/peer_clock.py): one per timed
    step, summing to the run's seconds."""
    steps = run.get("step_seconds")
    if steps is None:
        return []
    problems = []
    if len(steps) != run["steps"]:
        problems.append(f"{len(steps)} step times for {run['steps']} timed steps")
    if abs(sum(steps) - run["seconds"]) > 1e-6 * max(1.0, run["seconds"]):
        problems.append(f"step times sum to {sum(steps)}, the run says {run['seconds']}")
    return problems


def slot_problems(real_tokens: int, steps: int, tokens_per_step_per_gpu: int, gpus: int) -> list[str]:
    """More real tokens than the timed steps had token slots: counted outside the clock, or over all ranks twice."""
    slots = steps * tokens_per_step_per_gpu * gpus
    return [f"real_tokens {real_tokens:,} > {steps} steps x {tokens_per_step_per_gpu:,} tokens x {gpus} GPUs "
            f"= {slots:,}"] if real_tokens > slots else []


def side_problems(ours: dict[str, Any], peer: dict[str, Any], reason: str | None) -> list[str]:
    """Two sides of one comparison, each {steps, tokens_per_step, gradient_checkpointing}: what differs,
    unless a reason is recorded."""
    if reason:
        return []
    return [f"{key}: ours {ours[key]}, the other side {peer[key]} (no recorded reason)"
            for key in ("steps", "tokens_per_step", "gradient_checkpointing") if ours[key] != peer[key]]


def mean_mfu_problems(block: dict[str, Any]) -> list[str]:
    """`mean_step_mfu` over exactly the timed windows (those past the clock's start)."""
    if not block.get("windows") or "mean_step_mfu" not in block:
        return []
    _, timed = _timed(block["windows"])
    mfus = [w["mfu"] for w in timed if w.get("mfu")]
    derived = statistics.fmean(mfus) if mfus else None
    recorded = block["mean_step_mfu"]
    if derived is None or recorded is None:
        return [] if derived == recorded else [f"mean_step_mfu {recorded}, over the timed windows {derived}"]
    if abs(recorded - derived) > REL * abs(derived):
        return [f"mean_step_mfu {recorded} is not the mean over the timed windows ({derived})"]
    return []


def accumulation(record: dict[str, Any]) -> int:
    """Micro-batches per optimizer step of our multi-GPU run (bench/multi/multi_full.py's --ours-set)."""
    command = record["provenance"]["command"]
    values = [arg.split("=", 1)[1] for flag, arg in zip(command, command[1:])
              if flag == "--ours-set" and arg.startswith("train.gradient_accumulation_steps=")]
    return int(values[-1]) if values else 1


def single_side(r: dict[str, Any]) -> dict[str, Any]:
    """A one-GPU file's side of a comparison (bench/suites/gpu_single.py): one micro-batch of `budget` tokens
    a step; checkpointing as its variant or peer configures it (peer_fastchat.py always, TRL only as -ckpt)."""
    path = r["path"]
    if path.startswith("peer-"):
        checkpointing = path == "peer-fastchat" or path.endswith("-ckpt")
    else:
        checkpointing = VARIANTS[path]["train"]["gradient_checkpointing"]
    tokens = VARIANTS.get(path, {}).get("data", {}).get("tokens_per_micro_batch", r["budget"])
    return {"steps": r["steps"], "tokens_per_step": tokens, "gradient_checkpointing": checkpointing}


def _problems(name: str, check: str, found: list[str]) -> list[str]:
    return [] if (name, check) in ALLOWED else [f"{check}: {line}" for line in found]


def multi_problems(r: dict[str, Any], name: str) -> list[str]:
    """bench/multi/gpu_multi.py's files: our 8B run's windows, slots and MFU mean; its TRL peer's slots and step
    times; each comparison's sides (ours/peer at 8B full and LoRA, FP8/bf16)."""
    found: list[str] = []
    side = lambda block, tokens: {"steps": block["steps"], "tokens_per_step": tokens,  # noqa: E731
                                  "gradient_checkpointing": bool(block.get("gradient_checkpointing"))}
    reason = r.get("difference_reason")
    if "runs_per_side" in r:  # --repeat N: every run under `sides`
        return runs_problems(r, name, multi_tokens(r), r["gpu_count"])
    if ours := r.get("8b_full"):
        tokens = ours["tokens_per_micro_batch"] * accumulation(r)
        found += _problems(name, "windows", window_problems(ours))
        found += _problems(name, "mfu mean", mean_mfu_problems(ours))
        found += _problems(name, "token slots", slot_problems(ours["real_tokens"], ours["steps"], tokens, ours["gpu_count"]))
        if peer := r.get("8b_full_peer"):
            found += _problems(name, "comparison", side_problems(side(ours, tokens), side(peer, r["tokens_per_gpu"]), reason))
    if peer := r.get("8b_full_peer"):
        found += _problems(name, "token slots", slot_problems(peer["real_tokens"], peer["steps"], r["tokens_per_gpu"],
                                                              peer["gpu_count"]))
        found += _problems(name, "step times", step_time_problems(peer))
    if "8b_lora" in r and "8b_lora_peer" in r:  # ours: --gradient_checkpointing false (bench/multi/gpu_multi_lora.py)
        for key in ("8b_lora", "8b_lora_peer"):
            block = r[key]
            found += _problems(name, "token slots", slot_problems(block["real_tokens"], block["steps"], r["budget"],
                                                                  block["gpu_count"]))
        found += _problems(name, "comparison", side_problems(side(r["8b_lora"], r["budget"]),
                                                             side(r["8b_lora_peer"], r["budget"]), reason))
    if fp8 := r.get("fp8_8b"):  # both sides ours, same call and tokens per GPU
        found += _problems(name, "comparison", side_problems(side(fp8["fp8"], 0), side(fp8["bf16"], 0), reason))
    return found


def single_problems(r: dict[str, Any], name: str, peer: dict[str, Any] | None) -> list[str]:
    """bench/suites/gpu_single.py's one-run files: slots; against the peer it names, the sides."""
    me = single_side(r)
    found = _problems(name, "token slots", slot_problems(r["real_tokens"], r["steps"], me["tokens_per_step"], 1)
                      if r["path"] != "peer-fastchat" else [])  # padded batches of 8: no token budget a step
    found += _problems(name, "step times", step_time_problems(r))
    if peer is not None:
        found += _problems(name, "comparison", side_problems(me, single_side(peer), r.get("difference_reason")))
    return found


def compare_problems(r: dict[str, Any], name: str) -> list[str]:
    """bench/suites/gpu_single.py --repeat N's files: every run's windows or step times and slots, and the sides."""
    tokens = {label: VARIANTS.get(side["path"], {}).get("data", {}).get("tokens_per_micro_batch", r["budget"])
              for label, side in r["sides"].items()}
    return runs_problems(r, name, tokens, 1)


def multi_tokens(r: dict[str, Any]) -> dict[str, int]:
    """Tokens per GPU per optimizer step of each side of a multi-GPU --repeat file (bench/multi/multi_full.py: ours
    with its micro-batches per step; bench/multi/gpu_multi_lora.py: --budget on both)."""
    if "tokens_per_gpu" in r:
        return {"ours": r["tokens_per_gpu"] * accumulation(r), "peer": r["tokens_per_gpu"]}
    return {"ours": r["budget"], "peer": r["budget"]}


def runs_problems(r: dict[str, Any], name: str, tokens: dict[str, int], gpus: int) -> list[str]:
    """A --repeat file's runs (bench/report/distribution.py's `sides`): each run's windows, MFU mean, step times and
    token slots (`tokens` per step per GPU, by side); one step count and one activation checkpointing (the run's,
    else its side's) within a side; the two sides as side_problems compares them."""
    found: list[str] = []
    sides = {}
    for label, side in r["sides"].items():
        runs = [run for run in side["runs"] if "error" not in run]
        for run in runs:
            found += _problems(name, "windows", window_problems(run))
            found += _problems(name, "mfu mean", mean_mfu_problems(run))
            found += _problems(name, "step times", step_time_problems(run))
            if side["path"] != "peer-fastchat":  # padded batches of 8: no token budget a step
                found += _problems(name, "token slots", slot_problems(run["real_tokens"], run["steps"], tokens[label],
                                                                      run.get("gpu_count", gpus)))
        steps = {run["steps"] for run in runs}
        checkpointing = {bool(run.get("gradient_checkpointing", side["gradient_checkpointing"])) for run in runs}
        for what, values in (("step counts", steps), ("activation checkpointing", checkpointing)):
            if len(values) > 1:
                found += _problems(name, "comparison", [f"{label}'s runs differ in {what} {sorted(values)}"])
        sides[label] = {"steps": min(steps, default=0), "tokens_per_step": tokens[label],
                        "gradient_checkpointing": min(checkpointing, default=side["gradient_checkpointing"])}
    found += _problems(name, "comparison", side_problems(sides["ours"], sides["peer"], r.get("difference_reason")))
    return found


def check_compare_record(r: dict, name: str) -> None:
    """bench/suites/gpu_single.py --repeat N: each run's rate and FLOP numbers from its raw fields, the order
    alternating from the peer, a re-run only for a slow peer run, and the figure (runs_per_side, ratio_median,
    ratio_min, ratio_max, peer_low_runs) re-derived from the runs (bench/report/distribution.py)."""
    lengths = document_lengths(r["docs"], r["budget"])
    ours, peer = r["sides"]["ours"]["runs"], r["sides"]["peer"]["runs"]
    for run in (x for x in ours + peer if "error" not in x):
        check_run_block({**run, "gpu_count": 1, "peak_flops": r["peak_flops"]}, SHAPES[r["shape"]], lengths, name)
    check_distribution(r, name)


def check_distribution(r: dict, name: str) -> None:
    """A --repeat file's figure (single- or multi-GPU): the order alternating from the peer, a re-run only for a slow
    peer run, and runs_per_side, ratio_median, ratio_min, ratio_max, peer_low_runs re-derived from the runs."""
    ours, peer = r["sides"]["ours"]["runs"], r["sides"]["peer"]["runs"]
    n = r["runs_per_side"]
    assert n >= distribution.RUNS_PER_SIDE, f"{name}: {n} runs a side"
    assert r["order"][:2 * n] == distribution.alternating(n) and r["order"].count("ours") == len(ours), f"{name}: order"
    assert r["order"].count("peer") == len(peer), f"{name}: order"
    first = [{k: v for k, v in run.items() if k != "rerun_as"} for run in peer[:n]]  # as they stood before re-runs
    rerun = [index for index, run in enumerate(peer) if "rerun_as" in run]
    assert rerun == distribution.low_runs(first), f"{name}: re-runs {rerun}, slow peer runs {distribution.low_runs(first)}"
    assert [peer[i]["rerun_as"] for i in rerun] == list(range(n, len(peer))), f"{name}: re-runs and their runs"
    derived = distribution.summary(ours, peer)
    assert derived.keys() <= r.keys(), f"{name}: lacks {derived.keys() - r.keys()}"
    for key in ("ratio_median", "ratio_min", "ratio_max"):
        close(r[key], derived[key], key, name)
    assert (r["runs_per_side"], r["peer_low_runs"]) == (derived["runs_per_side"], derived["peer_low_runs"]), name




def save_async_problems(r: dict[str, Any], name: str) -> list[str]:
    """bench/multi/gpu_save_async.py's `save-async.json`: each run's rate and FLOP numbers from its raw fields (the
    FLOP count from the shape where the file names its documents' length cap); each save of the run in the run's
    own mode (none in nosave); `save_pause_s` and `write_gbps` (gb / write_s) one per save; the pauses past the
    warm-up summed, and the MFU with them counted as wall time (<= the MFU without); a resume that started."""
    found: list[str] = []
    lengths = sample_lengths(r["docs"], seed=0, hi=r["max_doc_tokens"]) if "max_doc_tokens" in r else None
    for run in SAVE_RUNS:
        block = r.get(run)
        if block is None:  # a failed run is recorded as such
            continue
        at = f"{run}: "
        found += [at + line for line in _rate_problems(block, r["arch"], lengths)]
        saves = block["saves"]
        modes = {save["mode"] for save in saves}
        if (run == "nosave" and saves) or (run != "nosave" and modes - {run}):
            found.append(f"{at}saves in mode {sorted(modes)}")
        for key, derived in (("save_pause_s", [s["save_pause_s"] for s in saves]),
                             ("write_gbps", [s["gb"] / s["write_s"] for s in saves if s["write_s"]])):
            if len(block[key]) != len(derived) or any(not _near(a, b) for a, b in zip(block[key], derived)):
                found.append(f"{at}{key} {block[key]}, from its saves {derived}")
        paused = sum(s["save_pause_s"] for s in saves if s["step"] > block["warmup_steps"])
        if not _near(block["save_pause_total_s"], paused):
            found.append(f"{at}save_pause_total_s {block['save_pause_total_s']}, its timed saves' pauses sum to {paused}")
        with_pauses = None if block["mfu"] is None else block["mfu"] * block["seconds"] / (block["seconds"] + paused)
        if not _near(block["mfu_with_pauses"], with_pauses):
            found.append(f"{at}mfu_with_pauses {block['mfu_with_pauses']}, re-derived {with_pauses}")
        if run == "nosave" and block.get("step_s_median_writing") is not None:  # files from 2026-12-06 13:30 on
            found.append(f"{at}step_s_median_writing {block['step_s_median_writing']} in a run without saves")
        if block["mfu"] is not None and (block["mfu_with_pauses"] or 0) > block["mfu"]:
            found.append(f"{at}mfu_with_pauses {block['mfu_with_pauses']} > mfu {block['mfu']}")
    if r.get("async") and r.get("resume_exit") == 0 and not (r.get("resume_s") or 0) > 0:
        found.append(f"resume_s {r.get('resume_s')}: a resume that ran took no time")
    return found + _resume_phase_problems(r)


# The startup record ends at the first step, resume_s at the first step's log line (its asctime, to the ms):
# both from the same start, the phases may exceed it by rounding only.
PHASES_SLACK_S = 0.05


def _resume_phase_problems(r: dict[str, Any]) -> list[str]:
    """`resume_phases` (files from #53 deliver 4 on): each phase's seconds >= 0, their sum <= resume_s."""
    phases = r.get("resume_phases")
    if not phases:
        return []
    found = [f"resume_phases: {name} {seconds} s" for name, seconds in phases.items() if not seconds >= 0]
    if r.get("resume_s") is not None and sum(phases.values()) > r["resume_s"] + PHASES_SLACK_S:
        found.append(f"resume_phases sum to {sum(phases.values()):.3f} s, more than resume_s {r['resume_s']:.3f} s")
    return found


def _near(recorded: float | None, derived: float | None) -> bool:
    if recorded is None or derived is None:
        return recorded is derived
    return abs(recorded - derived) <= REL * max(abs(recorded), abs(derived))


def _rate_problems(block: dict[str, Any], arch: dict, lengths: list[int] | None) -> list[str]:
    """check_run_block's numbers as lines: the rate from tokens and seconds; the FLOP count from the shape (when the
    documents are known), TFLOP/s and MFU from the rate and the FLOP count."""
    rate = block["real_tokens"] / block["seconds"]
    per_token = block["flops_per_token"]
    if lengths is not None:
        per_token = throughput_numbers(arch, lengths, rate, block["gpu_count"], block["peak_flops"])["flops_per_token"]
    tflops = per_token * rate / block["gpu_count"] / 1e12
    derived = {"real_tokens_per_s": rate, "flops_per_token": per_token, "tflops_per_gpu": tflops,
               "mfu": tflops * 1e12 / block["peak_flops"] if block["peak_flops"] else None}
    return [f"{key} {block[key]}, re-derived {value}" for key, value in derived.items() if not _near(block[key], value)]


PREDICTION = ("predicted_tokens_per_s_per_gpu", "speed_error")  # results_io.write_result's, in each run's block


def _blocks(record: dict[str, Any], where: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every dict in a results file with the keys that lead to it (the file itself: ())."""
    found = [(where, record)]
    for key, value in record.items():
        if isinstance(value, dict):
            found += _blocks(value, (*where, key))
    return found


def speed_problems(r: dict[str, Any], name: str) -> list[str]:
    """The plan's prediction beside each run of ours: speed_error = predicted / measured - 1, the measured rate
    as bench/report/speed_inputs.py reads it (the one that recorded it); both fields or neither; none on a block
    that is not such a run. Files written before issue #55 record none."""
    predicted = [(where, block) for where, block in _blocks(r) if set(PREDICTION) & block.keys()]
    if not predicted:
        return []
    runs = {run.where: run for run in runs_of(name, "", r)}  # no GPU type: only the measured rates are used
    found = []
    for where, block in predicted:
        at = ".".join(where) or "the file"
        run = runs.get(where)
        if run is None or not set(PREDICTION) <= block.keys():
            found.append(f"{at}: {sorted(set(PREDICTION) & block.keys())} without both, or no run of ours there")
            continue
        error = block["predicted_tokens_per_s_per_gpu"] / run.measured - 1
        if not _near(block["speed_error"], error):
            found.append(f"{at}: speed_error {block['speed_error']}, re-derived {error}")
    return found


def longctx_full_problems(r: dict[str, Any], file_name: str) -> list[str]:
    """bench/multi/gpu_context_parallel.py's `longctx-<shape>-full-<seq_len>-cp<N>.json`: its name from its fields;
    the rate, FLOP count (one document of seq_len tokens a step: s̄ = seq_len), TFLOP/s and MFU from the raw tokens
    and seconds; the timed windows' sums and MFU mean; no more real tokens than one document a CP group a step; the
    published peer's figure as the script holds it and its MFU by the same FLOP count; the issue's target."""
    from bench.multi.gpu_context_parallel import TARGET_MFU, TORCHTITAN

    found = []
    if file_name != f"longctx-{r['shape']}-full-{r['seq_len']}-cp{r['context_parallel']}.json":
        found.append(f"name: {file_name} is not the name gpu_context_parallel.py gives it")
    if r["gpu_count"] % r["context_parallel"]:
        found.append(f"context_parallel {r['context_parallel']} does not split {r['gpu_count']} GPUs")
    if r["target_mfu"] != (TARGET_MFU.get(r["seq_len"]) if r["gpu_count"] == 4 else None):
        found.append(f"target_mfu {r['target_mfu']} is not the issue's for {r['seq_len']} tokens on {r['gpu_count']} GPUs")
    if peer := r.get("published_peer"):
        published = TORCHTITAN["tokens_per_s_per_gpu"].get(r["seq_len"], peer["tokens_per_s_per_gpu"])
        mfu = throughput_numbers(r["arch"], [r["seq_len"]], peer["tokens_per_s_per_gpu"] * peer["gpus"], peer["gpus"],
                                 peer["peak_flops"])["mfu"]
        if peer["tokens_per_s_per_gpu"] != published or not _near(peer["mfu"], mfu):
            found.append(f"published peer: {peer['tokens_per_s_per_gpu']} tok/s/GPU at MFU {peer['mfu']}, "
                         f"published {published}, re-derived MFU {mfu}")
    if "error" in r:
        return found
    found += _rate_problems(r, r["arch"], [r["seq_len"]])
    found += [f"windows: {line}" for line in window_problems(r)] + mean_mfu_problems(r)
    found += slot_problems(r["real_tokens"], r["steps"], r["seq_len"], r["gpu_count"] // r["context_parallel"])
    if not _near(r["tokens_per_s_per_gpu"], r["real_tokens_per_s"] / r["gpu_count"]):
        found.append(f"tokens_per_s_per_gpu {r['tokens_per_s_per_gpu']}, re-derived {r['real_tokens_per_s'] / r['gpu_count']}")
    start, timed = _timed(r["windows"])
    if r["steps"] != timed[-1]["step"] - start or r["warmup_steps"] != start:
        found.append(f"steps {r['steps']} from step {r['warmup_steps']}: the windows time {timed[-1]['step'] - start} "
                     f"from step {start}")
    return found
