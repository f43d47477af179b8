"""BENCHMARKS.md's tables, generated from bench/results (never typed by hand).

    python -m bench.report.tables               # print every table
    python -m bench.report.tables --write       # rewrite the marked blocks of BENCHMARKS.md, README.md, docs/

A block in one of PAGES reads `<!-- table NAME -->`, the table (or generated prose), `<!-- /table -->`;
tests/bench/test_tables.py checks that every block equals this module's output for NAME and that
every table here has its block.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable

from bench.report.results_io import RESULTS, ROOT
from bench.report.table_cells import load_result, markdown_table, median_and_slow_steps, per_gpu_rate, percent, save_cell
from bench.report.figures import PROSE_TABLES, fill_figures
from bench.report.provenance_notes import PROVENANCE_TABLES
from bench.report.tables_headline import HEADLINE_TABLES
from bench.report.tables_parity import PARITY_TABLES
from bench.report.tables_save import FOUR_GPU_T10K, SAVE_TABLES

BENCHMARKS = ROOT / "BENCHMARKS.md"
# the pages with generated blocks and figures (bench/report/figures.py)
PAGES = (BENCHMARKS, ROOT / "README.md", ROOT / "docs" / "speed.md", ROOT / "docs" / "ARCHITECTURE.md")
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
EIGHT_B = "llama3-8b"


def _single_rows(folder: str, shape: str, paths: list[str]) -> list[list[str]]:
    """One row per run of one gpu_single call (a folder), in `paths` order; the ratio is to the
    fastest peer of that call, as gpu_single wrote it (or computed the same way for a peer)."""
    runs = [load_result(f"{folder}/single-{shape}-{path}.json") for path in paths]
    fastest = max((r for r in runs if r["path"].startswith("peer-")), key=lambda r: r["real_tokens_per_s"], default=None)
    rows = []
    for r in runs:
        ratio = f"{r['real_tokens_per_s'] / fastest['real_tokens_per_s']:.2f}× {fastest['path']}" if fastest else "–"
        counted = f"{r['real_tokens']:,} of {r['total_real_tokens']:,}" if "real_tokens" in r else "not recorded"
        rows.append([f"`{folder}/`", r["path"], f"{r['real_tokens_per_s']:,.0f}", percent(r["mfu"]),
                     f"{r['peak_mem_gib']:.1f}", ratio, counted])
    return rows


SINGLE_HEADER = ["call (bench/results/…)", "path", "real tokens/s", "MFU", "peak GiB", "vs fastest peer of the call (1 run a side)",
                 "real tokens counted"]
def single_1b() -> str:
    return markdown_table(SINGLE_HEADER, _single_rows("h100/single-2026-11-26", "llama3.2-1b",
                                                      ["peer-trl", "peer-trl-compile", "ours"]))


def qlora_8b() -> str:
    return markdown_table(SINGLE_HEADER, _single_rows("h100/qlora-2026-11-26", EIGHT_B, ["peer-trl-qlora", "ours-qlora"]))


TWO_GPU = "h100/two-gpu-2026-11-26"
FOUR_GPU = "h100/four-gpu-2026-11-26"
FOUR_GPU_FIXED = "h100/four-gpu-2026-11-27"  # after the fixed-length packed rows
TWO_H200 = "h200/two-gpu-2026-11-27"
FOUR_GPU_RECORD = "h100/four-gpu-2026-11-27d"  # the fourth 4-GPU session's calls on one machine
STEPS_8B = ("h100/four-gpu-2026-11-27b", "h100/four-gpu-2026-11-27c")  # the stall hunt: each 8B run's steps


def _llama70b(file: str, mfu_label: str) -> str:
    r = load_result(file)
    losses = list(r["losses"].values())
    return markdown_table(["file", "steps (timed)", "real tokens/s per GPU", mfu_label, "peak GiB allocated",
                           "plan GiB (when run)", "plan error", "loss first → last"],
                          [[f"`{file}`", f"{max(int(s) for s in r['losses'])} ({r['steps']} timed)",
                            f"{per_gpu_rate(r):,.0f}", percent(r["mfu"]), f"{r['peak_mem_gib']:.1f}",
                            f"{r['plan']['allocated_gib']:.1f}", f"{r['plan_error'] * 100:+.1f}%",
                            f"{losses[0]:.3f} → {losses[-1]:.3f}"]])


def qlora_70b() -> str:
    return _llama70b(f"{TWO_GPU}/qlora-llama70b-2gpu.json", "MFU (4·N + 6·N_lora)")


def lora_70b_4gpu() -> str:
    return _llama70b(f"{FOUR_GPU}/lora-bf16-llama70b-4gpu.json", "MFU (4·N + 6·N_lora, real tokens / wall time)")


def qlora_match() -> str:
    r = load_result(f"{TWO_GPU}/qlora-1gpu-vs-2gpu.json")
    rows = []
    for side in ("two", "one"):
        s, losses = r[side], list(r[side]["losses"].values())
        rows.append([s["path"], str(len(losses)), f"{losses[0]:.4f} → {losses[-1]:.4f}", f"{r['max_loss_diff']:.1e}",
                     f"{r['max_grad_norm_rel_diff']:.1e}", "met" if r["met"] else "NOT met"])
    return markdown_table(["run", "steps logged", "loss first → last", "max abs. loss diff", "max grad-norm rel. diff",
                           "≤ 1e-2"], rows)


def _scaling(folder: str, gpus: int) -> str:
    r = load_result(f"{folder}/multi-{gpus}gpu-1b-scaling.json")
    rows = []
    for count, b in r["scaling_1b"].items():
        rows.append([f"1B, {count} GPU{'s' if count != '1' else ''}", f"{per_gpu_rate(b):,.0f}",
                     percent(b["mfu"]), percent(b["mean_step_mfu"]), f"{b['peak_mem_gib']:.1f}", str(b["steps"])])
    rows.append([f"weak scaling 1 → {gpus}", f"{r['weak_scaling_efficiency'] * 100:.1f}%", "", "", "", ""])
    if "save_1b" in r:
        s = r["save_1b"]
        rows.append([f"full checkpoint save at step {s['step']} of the {gpus}-GPU run",
                     f"{save_cell(s)} = {s['gbps']:.2f} GB/s", "", "", "", ""])
    rows.append(["disk write bandwidth (dd, fsync)", f"{r['disk_write_gbps']:.2f} GB/s", "", "", "", ""])
    return markdown_table(["run", "real tokens/s per GPU", "MFU (real tokens / wall time)", "mean of per-step MFU",
                           "peak GiB", "steps timed"], rows)


def _resume(folder: str, gpus: int) -> str:
    r = load_result(f"{folder}/resume-{gpus}gpu.json")
    rows = []
    for row in r["results"]:
        verdict = ("bitwise" if row["bitwise"] else f"differs (max {row['max_abs_diff']:.1e})"
                   if row["bitwise"] is False else f"not compared: {row['error'].split(':')[0]}")
        rows.append([row["case"], str(row["sigterm_after_step"]), row.get("stop_checkpoint") or "–", verdict])
    return markdown_table([f"case ({gpus} GPUs)", "SIGTERM once step … was logged", "checkpoint it saved",
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
    r = load_result(f"{folder}/multi-4gpu-8b-full.json")
    ours, peer = r["8b_full"], r["8b_full_peer"]
    rows = [[side["path"], str(side["steps"]), f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]),
             percent(side.get("mean_step_mfu")), f"{side['peak_mem_gib']:.1f}", "yes" if side["gradient_checkpointing"] else "no"]
            for side in (peer, ours)]
    rows.append(["ours / peer, real tokens/s (1 run a side)", f"{r['ratio_vs_peer']:.2f}×", "", "", "", "", ""])
    save = ours["save"]
    rows.append([f"ours: full checkpoint save at step {save['step']}",
                 f"{save_cell(save)} = {save['gbps']:.2f} GB/s", "", "", "", "", ""])
    return markdown_table(["side (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU (real tokens / wall time)",
                           "mean of per-step MFU", "peak GiB", "activation checkpointing"], rows)


def full_8b_4gpu() -> str:
    return _full_8b(FOUR_GPU)


def full_8b_4gpu_fixed() -> str:
    return _full_8b(FOUR_GPU_FIXED)


def fp8_8b_4gpu() -> str:
    """FP8 against the bf16 run of ours from the same call (its 8b-peer phase), and TRL's bf16 peer."""
    r = load_result(f"{FOUR_GPU_FIXED}/multi-4gpu-fp8.json")["fp8_8b"]
    peer = load_result(f"{FOUR_GPU_FIXED}/multi-4gpu-8b-full.json")["8b_full_peer"]
    rows = [[label, str(side["steps"]), f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]),
             f"{side['peak_mem_gib']:.1f}", f"{side['real_tokens_per_s'] / r['bf16']['real_tokens_per_s']:.2f}×",
             f"{side['real_tokens_per_s'] / peer['real_tokens_per_s']:.2f}×"]
            for label, side in (("ours, bf16", r["bf16"]), (f"ours, FP8 ({r['recipe']})", r["fp8"]))]
    return markdown_table(["run (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "peak GiB",
                           "vs our bf16", "vs TRL (bf16) of the call, 1 run a side"], rows)


def _ours_8b_row(name: str, r: dict) -> list[str]:
    ours, command = r["8b_full"], " ".join(r["provenance"]["command"])
    median, slow = median_and_slow_steps(ours, 2)
    gc = "automatic" if "train.gc_every_steps=0" in command else "every 50th step"
    save = f"{ours['save']['seconds']:.1f} s, off the clock" if "save" in ours else "none"
    return [f"`{name}`", r["provenance"]["commit"][:7], ours["alloc_conf"].split(":")[1], gc, save, str(ours["steps"]),
            f"{per_gpu_rate(ours):,.0f}", percent(ours["mfu"]), f"{median:.2f}", slow]


def steps_8b_4gpu() -> str:
    """Every 8B full fine-tune run of the stall hunt: its settings, speed, median step and the steps over 1.5x it;
    then TRL's peer of the session and ours' last run against it."""
    files = [(f"{folder.split('/')[1]}/{path.name}", json.loads(path.read_text()))
             for folder in STEPS_8B for path in sorted((RESULTS / folder).glob("multi-4gpu-8b-full*.json"))]
    rows = [_ours_8b_row(name, r) for name, r in files if "8b_full" in r]
    peer_name, peer = next((name, r["8b_full_peer"]) for name, r in files if "8b_full_peer" in r)
    peer_rate = per_gpu_rate(peer)
    rows.append([f"`{peer_name}` (TRL peer)", "", peer["alloc_conf"].split(":")[1], "", "none", str(peer["steps"]),
                 f"{peer_rate:,.0f}", percent(peer["mfu"]), "", ""])
    last = files[-1][1]["8b_full"]
    rows.append(["last run of ours / this peer (not the same call)", "", "", "", "", "",
                 f"{per_gpu_rate(last) / peer_rate:.2f}×", "", "", ""])
    return markdown_table(["file (bench/results/h100/…)", "commit", "expandable segments", "Python GC", "save",
                           "steps timed", "real tokens/s per GPU", "MFU (real tokens / wall time)", "median step s",
                           "steps over 1.5 × median"], rows)


def fp8_8b_2gpu() -> str:
    """FP8 with fast and with fp32 forward accumulation, each against the bf16 run of the same call."""
    fast, exact = (load_result(f"{TWO_H200}/multi-2gpu-{tag}.json")["fp8_8b"] for tag in ("fp8", "fp8-fullacc"))
    runs = [("ours, bf16", fast["bf16"]), ("ours, FP8 tensorwise, fast accumulation", fast["fp8"]),
            ("ours, FP8 tensorwise, fp32 accumulation (`train.fp8_fast_accum = false`)", exact["fp8"])]
    rows = [[label, str(side["steps"]), f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]), f"{side['peak_mem_gib']:.1f}",
             f"{side['real_tokens_per_s'] / fast['bf16']['real_tokens_per_s']:.2f}×"] for label, side in runs]
    return markdown_table(["run (2 × H200)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "peak GiB",
                           "vs our bf16"], rows)


def fp8_8b_4gpu_allgather() -> str:
    """FP8 against the bf16 run of its call, and FP8 with FSDP2's float8 all-gather in the next call on the same
    machine against that bf16 run: each run's median step and its steps over 1.5x the median beside the totals."""
    r, gathered = (load_result(f"{FOUR_GPU_RECORD}/multi-4gpu-{tag}.json")["fp8_8b"] for tag in ("fp8", "fp8-allgather"))
    runs = [("ours, bf16", r["bf16"]), ("ours, FP8 tensorwise, fp32 accumulation", r["fp8"]),
            ("ours, FP8 + float8 all-gather (`train.fp8_all_gather = true`), next call", gathered["fp8"])]
    rows = []
    for label, side in runs:
        median, slow = median_and_slow_steps(side, 1)
        rows.append([label, str(side["steps"]), f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]), f"{median:.2f}", slow,
                     f"{side['peak_mem_gib']:.1f}", f"{side['real_tokens_per_s'] / r['bf16']['real_tokens_per_s']:.2f}×"])
    return markdown_table(["run (4 × H100)", "steps timed", "real tokens/s per GPU", "MFU vs the bf16 peak", "median step s",
                           "steps over 1.5 × median", "peak GiB", "vs our bf16"], rows)


def _full_8b_runs(gpus: str, runs: list[tuple[str, int, dict]], ratios: list[tuple[str, float]],
                  notes: tuple[tuple[str, str], ...] = ()) -> str:
    """8B full fine-tune runs (label, tokens per GPU, side), the ratios that compare them, then notes (label, text)."""
    rows = [[label, f"{tokens:,}", str(side["steps"]), f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]),
             f"{side['peak_mem_gib']:.1f}", "yes" if side["gradient_checkpointing"] else "no"] for label, tokens, side in runs]
    rows += [[label, "", "", f"{ratio:.2f}×", "", "", ""] for label, ratio in ratios]
    rows += [[label, text, "", "", "", "", ""] for label, text in notes]
    return markdown_table([f"side ({gpus})", "tokens per GPU per step", "steps timed", "real tokens/s per GPU",
                           "MFU (real tokens / wall time)", "peak GiB", "activation checkpointing"], rows)


def full_8b_2gpu() -> str:
    """Ours against TRL + FSDP2 in one call, and ours at twice the tokens per GPU (another call)."""
    r, big = load_result(f"{TWO_H200}/multi-2gpu-8b-full-ac.json"), load_result(f"{TWO_H200}/multi-2gpu-8b-full-t16k.json")
    runs = [("peer-trl", r["tokens_per_gpu"], r["8b_full_peer"]), ("ours", r["tokens_per_gpu"], r["8b_full"]),
            ("ours (another call)", big["tokens_per_gpu"], big["8b_full"])]
    return _full_8b_runs("2 × H200", runs, [("ours / peer (same call, 1 run a side), real tokens/s", r["ratio_vs_peer"])])


def full_8b_4gpu_record() -> str:
    """Ours with one timed save against TRL + FSDP2 in one call; ours at 10,240 tokens per GPU in the next call on
    that machine and on a fresh machine with the FA4 launch fix; the save; ours against the fastest TRL run yet."""
    r = load_result(f"{FOUR_GPU_RECORD}/multi-4gpu-8b-full.json")
    near, fresh = (load_result(f"{folder}/multi-4gpu-8b-full-t10k.json") for folder in (FOUR_GPU_RECORD, FOUR_GPU_T10K))
    runs = [("peer-trl", r["tokens_per_gpu"], r["8b_full_peer"]),
            ("ours, one full save inside the run", r["tokens_per_gpu"], r["8b_full"]),
            (f"ours, next call ({near['provenance']['commit'][:7]})", near["tokens_per_gpu"], near["8b_full"]),
            (f"ours, fresh machine ({fresh['provenance']['commit'][:7]})", fresh["tokens_per_gpu"], fresh["8b_full"])]
    peers = [json.loads(path.read_text()) for path in sorted(RESULTS.glob("h100/four-gpu-*/multi-4gpu-8b-full*.json"))]
    fastest_peer = max(per_gpu_rate(p["8b_full_peer"]) for p in peers if "8b_full_peer" in p)
    save = r["8b_full"]["save"]
    return _full_8b_runs("4 × H100", runs, [
        ("ours / peer (same call, 1 run a side), real tokens/s", r["ratio_vs_peer"]),
        ("ours with the save / the fastest TRL run of any call", per_gpu_rate(r["8b_full"]) / fastest_peer),
    ], notes=((f"ours: the full checkpoint save at step {save['step']}",
               f"{save_cell(save)} = {save['gbps']:.2f} GB/s"),))


def resume_4gpu_zero3() -> str:
    return _resume(FOUR_GPU_FIXED, 4)


def _lora_8b(path: str, gpus: str) -> str:
    r = load_result(path)
    rows = [[side["path"], str(side["steps"]), f"{per_gpu_rate(side):,.0f}",
             percent(side["mfu"]), f"{side['peak_mem_gib']:.1f}"] for side in (r["8b_lora_peer"], r["8b_lora"])]
    rows.append(["ours / peer, real tokens/s (1 run a side)", f"{r['ratio_vs_peer']:.2f}×", "", "", ""])
    return markdown_table([f"side ({gpus})", "steps timed", "real tokens/s per GPU", "MFU (4·N + 6·N_lora)", "peak GiB"],
                          rows)


def lora_8b_2gpu() -> str:
    return _lora_8b("h100/two-gpu-2026-11-27/multi-2gpu-8b-lora.json", "2 × H100")


def lora_8b_4gpu() -> str:
    return _lora_8b(f"{FOUR_GPU_RECORD}/multi-4gpu-8b-lora.json", "4 × H100")


def cli_latency() -> str:
    data = load_result("cpu/cli-latency.json")
    machine = data["machine"]
    where = (f"{machine['cpu']}, {machine['cores']} cores, load average {machine['load_avg_1m_before']:.1f} → "
             f"{machine['load_avg_1m_after']:.1f}")
    rows = [[f"`sft-launch {row['command']}`", f"{row['median_s']:.3f}", f"{min(row['times_s']):.3f}",
             f"{max(row['times_s']):.3f}", f"{row['target_s']:.1f}", "yes" if row["met"] else "no", where]
            for row in data["rows"]]
    return markdown_table(["command", "median s", "min s", "max s", "target s", "met", "machine"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "single-1b": single_1b, "qlora-8b": qlora_8b, "cli-latency": cli_latency, "qlora-70b": qlora_70b, "qlora-match": qlora_match,
    "two-gpu-scaling": two_gpu_scaling, "resume-2gpu": resume_2gpu, "four-gpu-scaling": four_gpu_scaling,
    "resume-4gpu": resume_4gpu, "full-8b-4gpu": full_8b_4gpu, "lora-70b-4gpu": lora_70b_4gpu,
    "full-8b-4gpu-fixed": full_8b_4gpu_fixed, "fp8-8b-4gpu": fp8_8b_4gpu, "resume-4gpu-zero3": resume_4gpu_zero3,
    "lora-8b-2gpu": lora_8b_2gpu, "steps-8b-4gpu": steps_8b_4gpu, "fp8-8b-2gpu": fp8_8b_2gpu, "full-8b-2gpu": full_8b_2gpu,
    "full-8b-4gpu-record": full_8b_4gpu_record, "fp8-8b-4gpu-allgather": fp8_8b_4gpu_allgather, "lora-8b-4gpu": lora_8b_4gpu,
    **SAVE_TABLES, **PARITY_TABLES, **HEADLINE_TABLES, **PROVENANCE_TABLES, **PROSE_TABLES,
}


def fill(text: str) -> str:
    """`text` with every marked block replaced by its generated table, every figure span by its figure."""
    return fill_figures(BLOCK.sub(lambda m: m.group(1) + TABLES[m.group("name")]() + m.group(4), text))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true",
                        help="rewrite the marked blocks of " + ", ".join(str(p.relative_to(ROOT)) for p in PAGES))
    args = parser.parse_args()
    if args.write:
        for page in PAGES:
            page.write_text(fill(page.read_text()))
        return
    for name, table in TABLES.items():
        print(f"<!-- table {name} -->\n{table()}<!-- /table -->\n")


if __name__ == "__main__":
    main()
