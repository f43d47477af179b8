"""BENCHMARKS.md's tables, generated from bench/results (never typed by hand).

    python -m bench.tables               # print every table
    python -m bench.tables --write       # rewrite the marked blocks of BENCHMARKS.md

A block in BENCHMARKS.md reads `<!-- table NAME -->`, the table, `<!-- /table -->`;
tests/bench/test_tables.py checks that every block equals this module's output for NAME and that
every table here has its block.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections.abc import Callable
from pathlib import Path

from bench.parity_record import eval_losses, runs_of, spread
from bench.results_io import RESULTS, ROOT

BENCHMARKS = ROOT / "BENCHMARKS.md"
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
EIGHT_B = "llama3-8b"


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _pct(value: float | None) -> str:
    return f"{value * 100:.1f}%" if value is not None else "n/a"


def _single_rows(folder: str, shape: str, paths: list[str]) -> list[list[str]]:
    """One row per run of one gpu_single call (a folder), in `paths` order; the ratio is to the
    fastest peer of that call, as gpu_single wrote it (or computed the same way for a peer)."""
    runs = [_load(f"{folder}/single-{shape}-{path}.json") for path in paths]
    fastest = max((r for r in runs if r["path"].startswith("peer-")), key=lambda r: r["real_tokens_per_s"], default=None)
    rows = []
    for r in runs:
        ratio = f"{r['real_tokens_per_s'] / fastest['real_tokens_per_s']:.2f}× {fastest['path']}" if fastest else "–"
        counted = f"{r['real_tokens']:,} of {r['total_real_tokens']:,}" if "real_tokens" in r else "not recorded"
        rows.append([f"`{folder}/`", r["path"], f"{r['real_tokens_per_s']:,.0f}", _pct(r["mfu"]),
                     f"{r['peak_mem_gib']:.1f}", ratio, counted])
    return rows


SINGLE_HEADER = ["call (bench/results/…)", "path", "real tokens/s", "MFU", "peak GiB", "vs fastest peer of the call",
                 "real tokens counted"]
def single_1b() -> str:
    return _markdown(SINGLE_HEADER, _single_rows("h100/single-2026-11-26", "llama3.2-1b",
                                                 ["peer-trl", "peer-trl-compile", "ours"]))


def _rate(side: dict) -> float:
    """Real tokens per second per GPU of one side or run."""
    return side["real_tokens_per_s"] / side["gpu_count"]


def qlora_8b() -> str:
    return _markdown(SINGLE_HEADER, _single_rows("h100/qlora-2026-11-26", EIGHT_B, ["peer-trl-qlora", "ours-qlora"]))


TWO_GPU = "h100/two-gpu-2026-11-26"
FOUR_GPU = "h100/four-gpu-2026-11-26"
FOUR_GPU_FIXED = "h100/four-gpu-2026-11-27"  # after the fixed-length packed rows
PARITY = ("h100/parity-2026-11-27a", "h100/parity-2026-11-27b", "h100/parity-2026-11-27c", "h200/parity-2026-11-27d")
TWO_H200 = "h200/two-gpu-2026-11-27"
FOUR_GPU_RECORD = "h100/four-gpu-2026-11-27d"  # the fourth 4-GPU session's calls on one machine
FOUR_GPU_T10K = "h100/four-gpu-2026-11-27e"  # its last call, a fresh machine
STEPS_8B = ("h100/four-gpu-2026-11-27b", "h100/four-gpu-2026-11-27c")  # the stall hunt: each 8B run's steps


def _llama70b(file: str, mfu_label: str) -> str:
    r = _load(file)
    losses = list(r["losses"].values())
    return _markdown(["file", "steps", "real tokens/s per GPU", mfu_label, "peak GiB allocated",
                      "plan GiB (when run)", "plan error", "loss first → last"],
                     [[f"`{file}`", str(max(int(s) for s in r["losses"])),
                       f"{_rate(r):,.0f}", _pct(r["mfu"]), f"{r['peak_mem_gib']:.1f}",
                       f"{r['plan']['allocated_gib']:.1f}", f"{r['plan_error'] * 100:+.1f}%",
                       f"{losses[0]:.3f} → {losses[-1]:.3f}"]])


def qlora_70b() -> str:
    return _llama70b(f"{TWO_GPU}/qlora-llama70b-2gpu.json", "MFU (4·N + 6·N_lora)")


def lora_70b_4gpu() -> str:
    return _llama70b(f"{FOUR_GPU}/lora-bf16-llama70b-4gpu.json", "MFU (4·N + 6·N_lora, real tokens / wall time)")


def qlora_match() -> str:
    r = _load(f"{TWO_GPU}/qlora-1gpu-vs-2gpu.json")
    rows = []
    for side in ("two", "one"):
        s, losses = r[side], list(r[side]["losses"].values())
        rows.append([s["path"], str(len(losses)), f"{losses[0]:.4f} → {losses[-1]:.4f}", f"{r['max_loss_diff']:.1e}",
                     f"{r['max_grad_norm_rel_diff']:.1e}", "met" if r["met"] else "NOT met"])
    return _markdown(["run", "steps logged", "loss first → last", "max abs. loss diff", "max grad-norm rel. diff",
                      "≤ 1e-2"], rows)


def _scaling(folder: str, gpus: int) -> str:
    r = _load(f"{folder}/multi-{gpus}gpu-1b-scaling.json")
    rows = []
    for count, b in r["scaling_1b"].items():
        rows.append([f"1B, {count} GPU{'s' if count != '1' else ''}", f"{_rate(b):,.0f}",
                     _pct(b["mfu"]), _pct(b["mean_step_mfu"]), f"{b['peak_mem_gib']:.1f}", str(b["steps"])])
    rows.append([f"weak scaling 1 → {gpus}", f"{r['weak_scaling_efficiency'] * 100:.1f}%", "", "", "", ""])
    if "save_1b" in r:
        s = r["save_1b"]
        rows.append([f"full checkpoint save at step {s['step']} of the {gpus}-GPU run",
                     f"{s['gb']:.1f} GB in {s['seconds']:.1f} s = {s['gbps']:.2f} GB/s", "", "", "", ""])
    rows.append(["disk write bandwidth (dd, fsync)", f"{r['disk_write_gbps']:.2f} GB/s", "", "", "", ""])
    return _markdown(["run", "real tokens/s per GPU", "MFU (real tokens / wall time)", "mean of per-step MFU",
                      "peak GiB", "steps timed"], rows)


def _resume(folder: str, gpus: int) -> str:
    r = _load(f"{folder}/resume-{gpus}gpu.json")
    rows = []
    for row in r["results"]:
        verdict = ("bitwise" if row["bitwise"] else f"differs (max {row['max_abs_diff']:.1e})"
                   if row["bitwise"] is False else f"not compared: {row['error'].split(':')[0]}")
        rows.append([row["case"], str(row["sigterm_after_step"]), row.get("stop_checkpoint") or "–", verdict])
    return _markdown([f"case ({gpus} GPUs)", "SIGTERM once step … was logged", "checkpoint it saved",
                      "final weights vs uninterrupted"], rows)


def two_gpu_scaling() -> str:
    return _scaling(TWO_GPU, 2)


def four_gpu_scaling() -> str:
    return _scaling(FOUR_GPU, 4)


def resume_2gpu() -> str:
    return _resume(TWO_GPU, 2)


def resume_4gpu() -> str:
    return _resume(FOUR_GPU, 4)


def _full_8b(folder: str) -> str:
    r = _load(f"{folder}/multi-4gpu-8b-full.json")
    ours, peer = r["8b_full"], r["8b_full_peer"]
    rows = [[side["path"], str(side["steps"]), f"{_rate(side):,.0f}", _pct(side["mfu"]),
             _pct(side.get("mean_step_mfu")), f"{side['peak_mem_gib']:.1f}", "yes" if side["gradient_checkpointing"] else "no"]
            for side in (peer, ours)]
    rows.append(["ours / peer, real tokens/s", f"{r['ratio_vs_peer']:.2f}×", "", "", "", "", ""])
    save = ours["save"]
    rows.append([f"ours: full checkpoint save at step {save['step']}",
                 f"{save['gb']:.1f} GB in {save['seconds']:.1f} s = {save['gbps']:.2f} GB/s", "", "", "", "", ""])
    return _markdown(["side (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU (real tokens / wall time)",
                      "mean of per-step MFU", "peak GiB", "activation checkpointing"], rows)


def full_8b_4gpu() -> str:
    return _full_8b(FOUR_GPU)


def full_8b_4gpu_fixed() -> str:
    return _full_8b(FOUR_GPU_FIXED)


def fp8_8b_4gpu() -> str:
    """FP8 against the bf16 run of ours from the same call (its 8b-peer phase), and TRL's bf16 peer."""
    r = _load(f"{FOUR_GPU_FIXED}/multi-4gpu-fp8.json")["fp8_8b"]
    peer = _load(f"{FOUR_GPU_FIXED}/multi-4gpu-8b-full.json")["8b_full_peer"]
    rows = [[label, str(side["steps"]), f"{_rate(side):,.0f}", _pct(side["mfu"]),
             f"{side['peak_mem_gib']:.1f}", f"{side['real_tokens_per_s'] / r['bf16']['real_tokens_per_s']:.2f}×",
             f"{side['real_tokens_per_s'] / peer['real_tokens_per_s']:.2f}×"]
            for label, side in (("ours, bf16", r["bf16"]), (f"ours, FP8 ({r['recipe']})", r["fp8"]))]
    return _markdown(["run (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "peak GiB",
                      "vs our bf16", "vs TRL (bf16) of the call"], rows)


def _step_times(run: dict) -> list[tuple[int, float]]:
    return [(w["step"], w["seconds"]) for w in run["windows"] if w["step"] > run["warmup_steps"]]


def _ours_8b_row(name: str, r: dict) -> list[str]:
    ours, command = r["8b_full"], " ".join(r["provenance"]["command"])
    steps = _step_times(ours)
    median = statistics.median(seconds for _, seconds in steps)
    slow = ", ".join(f"{step}: {seconds:.2f} s" for step, seconds in steps if seconds > 1.5 * median) or "none"
    gc = "automatic" if "train.gc_every_steps=0" in command else "every 50th step"
    save = f"{ours['save']['seconds']:.1f} s, off the clock" if "save" in ours else "none"
    return [f"`{name}`", r["provenance"]["commit"][:7], ours["alloc_conf"].split(":")[1], gc, save, str(ours["steps"]),
            f"{_rate(ours):,.0f}", _pct(ours["mfu"]), f"{median:.2f}", slow]


def steps_8b_4gpu() -> str:
    """Every 8B full fine-tune run of the stall hunt: its settings, speed, median step and the steps over 1.5x it;
    then TRL's peer of the session and ours' last run against it."""
    files = [(f"{folder.split('/')[1]}/{path.name}", json.loads(path.read_text()))
             for folder in STEPS_8B for path in sorted((RESULTS / folder).glob("multi-4gpu-8b-full*.json"))]
    rows = [_ours_8b_row(name, r) for name, r in files if "8b_full" in r]
    peer_name, peer = next((name, r["8b_full_peer"]) for name, r in files if "8b_full_peer" in r)
    peer_rate = _rate(peer)
    rows.append([f"`{peer_name}` (TRL peer)", "", peer["alloc_conf"].split(":")[1], "", "none", str(peer["steps"]),
                 f"{peer_rate:,.0f}", _pct(peer["mfu"]), "", ""])
    last = files[-1][1]["8b_full"]
    rows.append(["last run of ours / this peer (not the same call)", "", "", "", "", "",
                 f"{_rate(last) / peer_rate:.2f}×", "", "", ""])
    return _markdown(["file (bench/results/h100/…)", "commit", "expandable segments", "Python GC", "save",
                      "steps timed", "real tokens/s per GPU", "MFU (real tokens / wall time)", "median step s",
                      "steps over 1.5 × median"], rows)


def fp8_8b_2gpu() -> str:
    """FP8 with fast and with fp32 forward accumulation, each against the bf16 run of the same call."""
    fast, exact = (_load(f"{TWO_H200}/multi-2gpu-{tag}.json")["fp8_8b"] for tag in ("fp8", "fp8-fullacc"))
    runs = [("ours, bf16", fast["bf16"]), ("ours, FP8 tensorwise, fast accumulation", fast["fp8"]),
            ("ours, FP8 tensorwise, fp32 accumulation (`train.fp8_fast_accum = false`)", exact["fp8"])]
    rows = [[label, str(side["steps"]), f"{_rate(side):,.0f}", _pct(side["mfu"]), f"{side['peak_mem_gib']:.1f}",
             f"{side['real_tokens_per_s'] / fast['bf16']['real_tokens_per_s']:.2f}×"] for label, side in runs]
    return _markdown(["run (2 × H200)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "peak GiB",
                      "vs our bf16"], rows)


def fp8_8b_4gpu_allgather() -> str:
    """FP8 against the bf16 run of its call, and FP8 with FSDP2's float8 all-gather in the next call on the same
    machine against that bf16 run: each run's median step and its steps over 1.5x the median beside the totals."""
    r, gathered = (_load(f"{FOUR_GPU_RECORD}/multi-4gpu-{tag}.json")["fp8_8b"] for tag in ("fp8", "fp8-allgather"))
    runs = [("ours, bf16", r["bf16"]), ("ours, FP8 tensorwise, fp32 accumulation", r["fp8"]),
            ("ours, FP8 + float8 all-gather (`train.fp8_all_gather = true`), next call", gathered["fp8"])]
    rows = []
    for label, side in runs:
        steps = _step_times(side)
        median = statistics.median(seconds for _, seconds in steps)
        slow = ", ".join(f"{step}: {seconds:.1f} s" for step, seconds in steps if seconds > 1.5 * median) or "none"
        rows.append([label, str(side["steps"]), f"{_rate(side):,.0f}", _pct(side["mfu"]), f"{median:.2f}", slow,
                     f"{side['peak_mem_gib']:.1f}", f"{side['real_tokens_per_s'] / r['bf16']['real_tokens_per_s']:.2f}×"])
    return _markdown(["run (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "median step s",
                      "steps over 1.5 × median", "peak GiB", "vs our bf16"], rows)


def parity_fullacc() -> str:
    """The session's FP8 accumulation parity file: each side's runs, mean and the comparison gpu_parity made."""
    r = _load("h200/parity-2026-11-27d/parity-llama3.2-1b-fp8-fullacc-repeats.json")
    judged = {c["side"]: c for c in r["comparisons"]}
    rows = [[side, ", ".join(f"{v:.4f}" for v in eval_losses(result)), f"{result['eval_loss']:.4f}",
             f"{judged[side]['eval_loss_ratio']:.4f}" if side in judged else "–",
             f"{result['real_tokens_per_s']:,.0f}"] for side, result in r["sides"].items()]
    return _markdown(["side (1B, 2 × H200)", "eval loss of each run", "mean", "mean / mean of ours", "real tokens/s"], rows)


def _full_8b_runs(gpus: str, runs: list[tuple[str, int, dict]], ratios: list[tuple[str, float]]) -> str:
    """8B full fine-tune runs (label, tokens per GPU, side) and the ratios that compare them."""
    rows = [[label, f"{tokens:,}", str(side["steps"]), f"{_rate(side):,.0f}", _pct(side["mfu"]),
             f"{side['peak_mem_gib']:.1f}", "yes" if side["gradient_checkpointing"] else "no"] for label, tokens, side in runs]
    rows += [[label, "", "", f"{ratio:.2f}×", "", "", ""] for label, ratio in ratios]
    return _markdown([f"side ({gpus})", "tokens per GPU per step", "steps timed", "real tokens/s per GPU",
                      "MFU (real tokens / wall time)", "peak GiB", "activation checkpointing"], rows)


def full_8b_2gpu() -> str:
    """Ours against TRL + FSDP2 in one call, and ours at twice the tokens per GPU (another call)."""
    r, big = _load(f"{TWO_H200}/multi-2gpu-8b-full-ac.json"), _load(f"{TWO_H200}/multi-2gpu-8b-full-t16k.json")
    runs = [("peer-trl", r["tokens_per_gpu"], r["8b_full_peer"]), ("ours", r["tokens_per_gpu"], r["8b_full"]),
            ("ours (another call)", big["tokens_per_gpu"], big["8b_full"])]
    return _full_8b_runs("2 × H200", runs, [("ours / peer (same call), real tokens/s", r["ratio_vs_peer"])])


def full_8b_4gpu_record() -> str:
    """Ours with one timed save against TRL + FSDP2 in one call; ours at 10,240 tokens per GPU in the next call on
    that machine and on a fresh machine with the FA4 launch fix; the save; ours against the fastest TRL run yet."""
    r = _load(f"{FOUR_GPU_RECORD}/multi-4gpu-8b-full.json")
    near, fresh = (_load(f"{folder}/multi-4gpu-8b-full-t10k.json") for folder in (FOUR_GPU_RECORD, FOUR_GPU_T10K))
    runs = [("peer-trl", r["tokens_per_gpu"], r["8b_full_peer"]),
            ("ours, one full save inside the run", r["tokens_per_gpu"], r["8b_full"]),
            (f"ours, next call ({near['provenance']['commit'][:7]})", near["tokens_per_gpu"], near["8b_full"]),
            (f"ours, fresh machine ({fresh['provenance']['commit'][:7]})", fresh["tokens_per_gpu"], fresh["8b_full"])]
    peers = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("h100/four-gpu-*/multi-4gpu-8b-full*.json"))]
    fastest_peer = max(_rate(p["8b_full_peer"]) for p in peers if "8b_full_peer" in p)
    save = r["8b_full"]["save"]
    return _full_8b_runs("4 × H100", runs, [
        ("ours / peer (same call), real tokens/s", r["ratio_vs_peer"]),
        ("ours with the save / the fastest TRL run of any call", _rate(r["8b_full"]) / fastest_peer),
    ]) + f"| ours: the full checkpoint save at step {save['step']} | {save['gb']:.1f} GB in {save['seconds']:.1f} s = " \
         f"{save['gbps']:.2f} GB/s |  |  |  |  |  |\n"


def resume_4gpu_zero3() -> str:
    return _resume(FOUR_GPU_FIXED, 4)


def _lora_8b(path: str, gpus: str) -> str:
    r = _load(path)
    rows = [[side["path"], str(side["steps"]), f"{_rate(side):,.0f}",
             _pct(side["mfu"]), f"{side['peak_mem_gib']:.1f}"] for side in (r["8b_lora_peer"], r["8b_lora"])]
    rows.append(["ours / peer, real tokens/s", f"{r['ratio_vs_peer']:.2f}×", "", "", ""])
    return _markdown([f"side ({gpus})", "steps timed", "real tokens/s per GPU", "MFU (4·N + 6·N_lora)", "peak GiB"],
                     rows)


def lora_8b_2gpu() -> str:
    return _lora_8b("h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json", "2 × H100")


def lora_8b_4gpu() -> str:
    return _lora_8b(f"{FOUR_GPU_RECORD}/multi-4gpu-8b-lora.json", "4 × H100")


def _parity_files() -> list[tuple[str, dict]]:
    return [(f"{folder}/{path.name}", json.loads(path.read_text()))
            for folder in PARITY for path in sorted((RESULTS / folder).glob("parity-*.json"))]


def _trl_packs(side: str, result: dict) -> str | None:
    """Whose packs a TRL side trained on ("ours", "bfd"); files from before `packs` was recorded (d70026a)
    ran TRL's own BFD packing. None for our sides."""
    if not side.startswith("trl"):
        return None
    return runs_of(result)[0].get("packs", "bfd")


def parity_runs() -> str:
    """Every side of every parity file of the session: eval loss and the comparison gpu_parity made."""
    rows = []
    for name, r in _parity_files():
        judged = {c["side"]: c for c in r["comparisons"]}
        for side, result in r["sides"].items():
            c = judged.get(side)
            packs = {"ours": "our packs", "bfd": "its own BFD packs"}.get(_trl_packs(side, result) or "", "")
            rows.append([f"`{name}`", f"{r.get('warmup_ratio', 0.03):g}", f"{side} {packs}".strip(),
                         f"{result['eval_loss']:.4f}" if "eval_loss" in result else result.get("error", "–"),
                         c["reference"] if c else "–", f"{c['eval_loss_ratio']:.4f}" if c else "–",
                         ("yes" if c["within_target"] else "NO") if c else "–",
                         f"{result['real_tokens_per_s']:,.0f}" if result.get("real_tokens_per_s") else "–"])
    return _markdown(["file (bench/results/…)", "warm-up", "side", "eval loss", "vs", "ratio", "within 1%",
                      "real tokens/s"], rows)


def parity_spread() -> str:
    """Per GPU model and warm-up: every run of `ours` (the same settings, each on its own GPU) and its spread,
    beside the other sides' runs and each one's ratio to the mean of ours."""
    by_config: dict[tuple[str, float], dict[str, list[float]]] = {}
    for _, r in _parity_files():
        gpu = r["provenance"]["gpus"][0].removeprefix("NVIDIA ")
        runs = by_config.setdefault((gpu, r.get("warmup_ratio", 0.03)), {})
        for side, result in r["sides"].items():
            label = "trl (its own BFD packs)" if side == "trl" and _trl_packs(side, result) == "bfd" else side
            runs.setdefault(label, []).extend(eval_losses(result))
    rows = []
    for (gpu, warmup), runs in by_config.items():
        ours = runs["ours"]
        mean = statistics.fmean(ours)
        for side, values in runs.items():
            apart, ratio = spread(values), statistics.fmean(values) / mean
            rows.append([gpu, f"{warmup:g}", side, ", ".join(f"{v:.4f}" for v in values),
                         f"{apart * 100:.1f}%" if apart is not None else "–", f"{ratio:.4f}",
                         _two_standard_errors(values), _two_standard_errors(values, ours) if side != "ours" else "–"])
    return _markdown(["GPU", "warm-up", "side", "eval loss of each run", "spread (max − min) / mean", "mean / mean of ours",
                      "± 2 standard errors of that mean (relative)", "± 2 standard errors of the ratio"], rows)


def _two_standard_errors(values: list[float], reference: list[float] | None = None) -> str:
    """Two standard errors of the mean of `values` relative to it; with `reference`, of the ratio of the two
    means (relative errors added in quadrature, times the ratio). "–" where a side has a single run."""
    def relative(runs: list[float]) -> float:
        return statistics.stdev(runs) / len(runs) ** 0.5 / statistics.fmean(runs)

    if len(values) < 2 or (reference is not None and len(reference) < 2):
        return "–"
    if reference is None:
        return f"± {2 * relative(values):.4f}"
    ratio = statistics.fmean(values) / statistics.fmean(reference)
    return f"± {2 * ratio * (relative(values) ** 2 + relative(reference) ** 2) ** 0.5:.4f}"


def cli_latency() -> str:
    data = _load("cpu/cli-latency.json")
    machine = data["machine"]
    where = (f"{machine['cpu']}, {machine['cores']} cores, load average {machine['load_avg_1m_before']:.1f} → "
             f"{machine['load_avg_1m_after']:.1f}")
    rows = [[f"`sft-launch {row['command']}`", f"{row['median_s']:.3f}", f"{min(row['times_s']):.3f}",
             f"{max(row['times_s']):.3f}", f"{row['target_s']:.1f}", "yes" if row["met"] else "no", where]
            for row in data["rows"]]
    return _markdown(["command", "median s", "min s", "max s", "target s", "met", "machine"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "single-1b": single_1b, "qlora-8b": qlora_8b, "cli-latency": cli_latency, "qlora-70b": qlora_70b, "qlora-match": qlora_match,
    "two-gpu-scaling": two_gpu_scaling, "resume-2gpu": resume_2gpu, "four-gpu-scaling": four_gpu_scaling,
    "resume-4gpu": resume_4gpu, "full-8b-4gpu": full_8b_4gpu, "lora-70b-4gpu": lora_70b_4gpu,
    "full-8b-4gpu-fixed": full_8b_4gpu_fixed, "fp8-8b-4gpu": fp8_8b_4gpu, "resume-4gpu-zero3": resume_4gpu_zero3,
    "lora-8b-2gpu": lora_8b_2gpu, "steps-8b-4gpu": steps_8b_4gpu, "parity-runs": parity_runs, "parity-spread": parity_spread,
    "fp8-8b-2gpu": fp8_8b_2gpu, "parity-fullacc": parity_fullacc, "full-8b-2gpu": full_8b_2gpu,
    "full-8b-4gpu-record": full_8b_4gpu_record, "fp8-8b-4gpu-allgather": fp8_8b_4gpu_allgather, "lora-8b-4gpu": lora_8b_4gpu,
}


def fill(text: str) -> str:
    """`text` with every marked block replaced by its generated table."""
    return BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(4), text)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true", help=f"rewrite the marked blocks of {BENCHMARKS.name}")
    args = parser.parse_args()
    if args.write:
        BENCHMARKS.write_text(fill(BENCHMARKS.read_text()))
        return
    for name, table in TABLES.items():
        print(f"<!-- table {name} -->\n{table()}<!-- /table -->\n")


if __name__ == "__main__":
    main()
