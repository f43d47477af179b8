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
from collections.abc import Callable
from pathlib import Path

from bench.results_io import RESULTS, ROOT

BENCHMARKS = ROOT / "BENCHMARKS.md"
BLOCK = re.compile(r"(<!-- table (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
ONE_B, EIGHT_B = "llama3.2-1b", "llama3-8b"


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
PEERS_1B = ["peer-fastchat", "peer-trl", "peer-trl-compile", "ours", "ours-liger"]


def single_1b() -> str:
    return _markdown(SINGLE_HEADER, _single_rows("h100", ONE_B, PEERS_1B) + _single_rows("h200", ONE_B, PEERS_1B))


def single_8b_lora() -> str:
    paths = ["peer-trl-lora", "ours-lora"]
    return _markdown(SINGLE_HEADER, _single_rows("h100", EIGHT_B, paths) + _single_rows("h200", EIGHT_B, paths))


def fused_mlp_h200() -> str:
    return _markdown(SINGLE_HEADER, _single_rows("h200/fused-mlp-ab-with-trl", ONE_B,
                                                 ["ours", "ours-stockmlp", "peer-trl-compile"]))


def second_session() -> str:
    three = ["ours", "ours-stockmlp", "peer-trl-compile"]
    return _markdown(SINGLE_HEADER, _single_rows("h100/cublas-mlp-quack-ce", ONE_B, three)
                     + _single_rows("h100/final-2026-11-25", ONE_B, three)
                     + _single_rows("h200/final-2026-11-25", ONE_B, ["ours", "peer-trl-compile"]))


def qlora_8b() -> str:
    return _markdown(SINGLE_HEADER, _single_rows("h100/qlora-2026-11-26", EIGHT_B, ["peer-trl-qlora", "ours-qlora"]))


TWO_GPU = "h100/two-gpu-2026-11-26"


def qlora_70b() -> str:
    r = _load(f"{TWO_GPU}/qlora-llama70b-2gpu.json")
    losses = list(r["losses"].values())
    return _markdown(["file", "steps", "real tokens/s per GPU", "MFU (4·N + 6·N_lora)", "peak GiB allocated",
                      "plan GiB (when run)", "plan error", "loss first → last"],
                     [[f"`{TWO_GPU}/qlora-llama70b-2gpu.json`", str(max(int(s) for s in r["losses"])),
                       f"{r['real_tokens_per_s'] / r['gpu_count']:,.0f}", _pct(r["mfu"]), f"{r['peak_mem_gib']:.1f}",
                       f"{r['plan']['allocated_gib']:.1f}", f"{r['plan_error'] * 100:+.1f}%",
                       f"{losses[0]:.3f} → {losses[-1]:.3f}"]])


def qlora_match() -> str:
    r = _load(f"{TWO_GPU}/qlora-1gpu-vs-2gpu.json")
    rows = []
    for side in ("two", "one"):
        s, losses = r[side], list(r[side]["losses"].values())
        rows.append([s["path"], str(len(losses)), f"{losses[0]:.4f} → {losses[-1]:.4f}", f"{r['max_loss_diff']:.1e}",
                     f"{r['max_grad_norm_rel_diff']:.1e}", "met" if r["met"] else "NOT met"])
    return _markdown(["run", "steps logged", "loss first → last", "max abs. loss diff", "max grad-norm rel. diff",
                      "≤ 1e-2"], rows)


def two_gpu_scaling() -> str:
    r = _load(f"{TWO_GPU}/multi-2gpu-1b-scaling.json")
    rows = []
    for gpus, b in r["scaling_1b"].items():
        rows.append([f"1B, {gpus} GPU{'s' if gpus != '1' else ''}", f"{b['real_tokens_per_s'] / b['gpu_count']:,.0f}",
                     _pct(b["mfu"]), _pct(b["mean_step_mfu"]), f"{b['peak_mem_gib']:.1f}", str(b["steps"])])
    rows.append(["weak scaling 1 → 2", f"{r['weak_scaling_efficiency'] * 100:.1f}%", "", "", "", ""])
    if "save_1b" in r:
        s = r["save_1b"]
        rows.append([f"full checkpoint save at step {s['step']} of the 2-GPU run",
                     f"{s['gb']:.1f} GB in {s['seconds']:.1f} s = {s['gbps']:.2f} GB/s", "", "", "", ""])
    rows.append(["disk write bandwidth (dd, fsync)", f"{r['disk_write_gbps']:.2f} GB/s", "", "", "", ""])
    return _markdown(["run", "real tokens/s per GPU", "MFU (real tokens / wall time)", "mean of per-step MFU",
                      "peak GiB", "steps timed"], rows)


def resume_2gpu() -> str:
    r = _load(f"{TWO_GPU}/resume-2gpu.json")
    rows = []
    for row in r["results"]:
        verdict = ("bitwise" if row["bitwise"] else f"differs (max {row['max_abs_diff']:.1e})"
                   if row["bitwise"] is False else f"not compared: {row['error'].split(':')[0]}")
        rows.append([row["case"], str(row["sigterm_after_step"]), row.get("stop_checkpoint") or "–", verdict])
    return _markdown(["case (2 GPUs)", "SIGTERM once step … was logged", "checkpoint it saved", "final weights vs uninterrupted"], rows)


def _mlp(name: str) -> str:
    data = _load(name)
    rows = [[row["path"].strip(), f"{row['ms']:.2f}", f"{row['ms'] * 16:.1f}", f"{row['saved_gib']:.2f}",
             f"{row['first_call_s']:.1f}", f"{row['max_rel_err']:.1e}"] for row in data["rows"]]
    return _markdown(["path", "ms per layer", "× 16 layers", "GiB kept for backward", "first call s", "max rel err"], rows)


def mlp_first() -> str:
    return _mlp("h100/mlp-llama3.2-1b.json")


def mlp_cublas() -> str:
    return _mlp("h100/mlp-llama3.2-1b-cublas.json")


def attention() -> str:
    rows = [[row["kernel"], f"{row['ms']:.2f}", f"{row['tflops']:.0f}"] if "ms" in row
            else [row["kernel"], f"failed: {row['error']}", ""] for row in _load("h100/attention-llama3.2-1b.json")["rows"]]
    return _markdown(["kernel", "ms per layer (fwd + bwd)", "TFLOP/s (causal count)"], rows)


def _step_matmuls(data: dict, chunk: int) -> tuple[float, float, float]:
    """(ms of every matmul of one step, their TFLOP/s, ms of the lm_head's matmuls) at a loss chunk."""
    rows = next(s["rows"] for s in data["steps"] if s["loss_chunk"] == chunk)
    total = sum((r["fwd_ms"] + r["dgrad_ms"] + r["wgrad_ms"]) * r["count"] for r in rows)
    flop = sum(r["flop"] * r["count"] for r in rows)
    lm_head = sum((r["fwd_ms"] + r["dgrad_ms"] + r["wgrad_ms"]) * r["count"] for r in rows if "lm_head" in r["what"])
    return total, flop / total / 1e9, lm_head


def ceilings() -> str:
    files = {"H100": "h100/ceilings-llama3.2-1b.json", "H100, second machine (`-loss`)": "h100/ceilings-llama3.2-1b-loss.json",
             "H200": "h200/ceilings-llama3.2-1b.json"}
    data = {gpu: _load(name) for gpu, name in files.items()}
    rows = [["device copy bandwidth (read + write)"] + [f"{d['copy_gbs']:,.0f} GB/s" for d in data.values()],
            ["bf16 8192³ matmul"] + [f"{d['square_bf16_tflops']:.0f} TFLOP/s" for d in data.values()]]
    rows.append(["every matmul of one 32,768-token step, each timed alone (lm_head in 1,024-token chunks)"]
                + ["{:.0f} ms ({:.0f} TFLOP/s)".format(*_step_matmuls(d, 1024)[:2]) for d in data.values()])
    rows.append(["the lm_head's three matmuls: 32 chunks of 1,024 → 8 chunks of 4,096"]
                + [f"{_step_matmuls(d, 1024)[2]:.1f} → {_step_matmuls(d, 4096)[2]:.1f} ms" for d in data.values()])
    rows.append(["lm_head + cross-entropy fwd + bwd (ours / Liger)"]
                + [" / ".join(f"{d['loss_fwd_bwd_ms'][k]:.1f}" for k in ("fused", "liger")) + " ms"
                   if d.get("loss_fwd_bwd_ms") else "not measured" for d in data.values()])
    return _markdown([""] + list(files), rows)


STRATEGY_FILES = ["jobs1-a", "jobs1-b", "jobs4-a", "jobs4-offload", "jobs4-fsdp1-fixed", "after-merge"]


def strategies() -> str:
    rows = []
    for tag in STRATEGY_FILES:
        for r in _load(f"h100/strategies-1gpu-{tag}.json")["results"]:
            if r["error"].startswith("skipped"):
                continue
            trains = f"{r['loss_first']:.2f} → {r['loss_last']:.2f}" if r["loss_first"] is not None else "–"
            resume = ("bitwise" if r["resume_bitwise"] else f"differs (max {r['resume_max_abs_diff']:.1e})"
                      if r["resume_bitwise"] is not None else f"not compared: {r['error'][:40]}")
            peak = f"{r['peak_gib']:.2f} / {r['predicted_allocated_gib']:.2f}" if r["peak_gib"] else "–"
            rows.append([tag, r["case"], trains, resume, "yes" if r["export_loads"] else "no",
                         f"{r['s_per_step']:.3f}" if r["s_per_step"] else "–", peak])
    return _markdown(["file (strategies-1gpu-…)", "case", "loss first → last", "resume vs uninterrupted",
                      "export loads", "s/step", "peak GiB measured / planner then"], rows)


TABLES: dict[str, Callable[[], str]] = {
    "single-1b": single_1b, "single-8b-lora": single_8b_lora, "fused-mlp-h200": fused_mlp_h200,
    "second-session": second_session, "mlp-first": mlp_first, "mlp-cublas": mlp_cublas, "attention": attention,
    "ceilings": ceilings, "strategies": strategies, "qlora-8b": qlora_8b,
    "qlora-70b": qlora_70b, "qlora-match": qlora_match, "two-gpu-scaling": two_gpu_scaling, "resume-2gpu": resume_2gpu,
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
