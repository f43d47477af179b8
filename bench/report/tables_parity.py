"""BENCHMARKS.md's tables of issue #27: learning parity (bench/suites/gpu_parity.py's files), FP8 in one decoder layer
(bench/kernels/gpu_fp8_layer.py's) and our float8 linears at 8B (bench/multi/multi_fp8.py's), part of bench/report/tables.py's output."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

from bench.report.parity_record import eval_losses, runs_of, spread
from bench.report.results_io import RESULTS
from bench.report.table_cells import load_result, markdown_table, median_and_slow_steps, per_gpu_rate, percent, timed_windows

FP8_LAYER = ("h100/single-2026-11-27/fp8layer-8b.json", "h100/single-2026-11-27/fp8layer-8b-b.json",
             "h100/single-2026-11-27/fp8layer-8b-t16k.json")
OWN_LAYER = ("h200/single-2026-11-28/fp8layer-8b-top40.json", "h200/single-2026-11-28/fp8layer-8b-own.json",
             "h200/single-2026-11-28/fp8layer-8b-own-b.json")
OWN_8B = ("h200/two-gpu-2026-11-28/multi-2gpu-fp8-own.json", "h200/two-gpu-2026-11-28/multi-2gpu-fp8-own-2.json")
OWN_8B_MORE = tuple(f"h200/two-gpu-2026-11-28b/multi-2gpu-fp8-own-{n}.json" for n in range(3, 7))  # eleventh session
AMAX_LAYER = {  # gpu_fp8_layer files of the amax experiment: where each computed the amaxes of our float8 linears
    "h200/single-2026-11-28b/fp8layer-8b-amax-graph-1.json": "in the graph, whole tensor",
    "h200/single-2026-11-28b/fp8layer-8b-amax-triton-1.json": "Triton kernel",
    "h200/single-2026-11-28b/fp8layer-8b-amax-graph-2.json": "in the graph, whole tensor",
    "h200/single-2026-11-28b/fp8layer-8b-amax-rows-1.json": "in the graph, rows then their max",
    "h200/single-2026-11-28b/fp8layer-8b-amax-triton-2.json": "Triton kernel",
    "h200/single-2026-11-28b/fp8layer-8b-amax-rows-2.json": "in the graph, rows then their max",
}
FP8_GEMMS = ("h200/single-2026-11-28b/fp8gemms-8b-t8192.json", "h200/single-2026-11-28b/fp8gemms-8b-t16384.json",
             "h200/single-2026-11-28b/fp8gemms-1b-t16384.json")
FP8_TARGET = 1.25  # issue #27: FP8 against our bf16 at 8B, real tokens/s
OWN_PARITY = "h200/parity-2026-11-28/parity-llama3.2-1b-own-fullacc.json"
PARITY = ("h100/parity-2026-11-27a", "h100/parity-2026-11-27b", "h100/parity-2026-11-27c", "h200/parity-2026-11-27d")


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
    return markdown_table(["file (bench/results/…)", "warm-up", "side", "eval loss", "vs", "ratio", "within 1%",
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
    return markdown_table(["GPU", "warm-up", "side", "eval loss of each run", "spread (max − min) / mean", "mean / mean of ours",
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


def parity_fullacc() -> str:
    """The session's FP8 accumulation parity file: each side's runs, mean and the comparison gpu_parity made."""
    return _parity_sides("h200/parity-2026-11-27d/parity-llama3.2-1b-fp8-fullacc-repeats.json", "side (1B, 2 × H200)")


def _parity_sides(path: str, side_header: str) -> str:
    r = load_result(path)
    judged = {c["side"]: c for c in r["comparisons"]}
    rows = [[side, ", ".join(f"{v:.4f}" for v in eval_losses(result)), f"{result['eval_loss']:.4f}",
             f"{judged[side]['eval_loss_ratio']:.4f}" if side in judged else "–",
             f"{result['real_tokens_per_s']:,.0f}"] for side, result in r["sides"].items()]
    return markdown_table([side_header, "eval loss of each run", "mean", "mean / mean of ours", "real tokens/s"], rows)


def _layer_rows(paths: tuple[str, ...], commit: bool = False) -> list[list[str]]:
    """One row per variant of each gpu_fp8_layer file: its median layer time, against the bf16 default of the same
    call, and its kernel time by kind over one profiled call; a variant that failed shows its error."""
    rows = []
    for path in paths:
        r = load_result(path)
        base = next(row["ms"] for row in r["rows"] if row["variant"] == "bf16-fused")
        for row in r["rows"]:
            cells = [f"`{path.split('/', 1)[1]}`", *([r["provenance"]["commit"][:7]] if commit else []),
                     f"{r['tokens']:,}", row["variant"]]
            if "error" in row:
                rows.append(cells + [row["error"].split(":")[0], "", "", "", "", ""])
                continue
            by_kind = row["kernel_ms"]
            compiled = by_kind.get("compiled elementwise", by_kind.get("compiled", 0))  # the first files' own name
            kinds = [by_kind.get("matmul", 0), compiled, by_kind.get("attention", 0), by_kind.get("other", 0)]
            rows.append(cells + [f"{row['ms']:.2f}", f"{base / row['ms']:.2f}×", *(f"{ms:.2f}" for ms in kinds)])
    return rows


LAYER_COLUMNS = ["tokens", "variant", "layer ms (fwd + bwd)", "bf16-fused ms / this", "matmul ms", "compiled ms",
                 "attention ms", "other ms"]


def fp8_layer_8b() -> str:
    """torchao's FP8 in one 8B decoder layer, on H100s (seventh session)."""
    return markdown_table(["file (bench/results/h100/…)", *LAYER_COLUMNS], _layer_rows(FP8_LAYER))


def fp8_own_layer_8b() -> str:
    """Our float8 linears in one 8B decoder layer beside torchao's and our bf16, on H200s (this session's calls)."""
    return markdown_table(["file (bench/results/h200/…)", "commit", *LAYER_COLUMNS], _layer_rows(OWN_LAYER, commit=True))


def _own_8b_table(paths: tuple[str, ...]) -> str:
    """8B on 2 GPUs, our bf16 path then FP8 with our float8 linears, in each call: speed, median step, the fastest
    and slowest timed step and the steps over 1.5x the median, and FP8 against the bf16 run of its call."""
    rows = []
    for path in paths:
        r = load_result(path)
        record = r["fp8_8b"]
        for label, side in (("ours, bf16", record["bf16"]), ("ours, FP8 tensorwise (our float8 linears)", record["fp8"])):
            median, slow = median_and_slow_steps(side, 2)
            seconds = [w["seconds"] for w in timed_windows(side["windows"])]
            rows.append([f"`{path.split('/', 1)[1]}`", r["provenance"]["commit"][:7], label, str(side["steps"]),
                         f"{per_gpu_rate(side):,.0f}", percent(side["mfu"]), f"{median:.2f}",
                         f"{min(seconds):.3f}–{max(seconds):.3f}", slow,
                         f"{side['peak_mem_gib']:.1f}",
                         f"{side['real_tokens_per_s'] / record['bf16']['real_tokens_per_s']:.2f}×"])
    return markdown_table(["file (bench/results/h200/…)", "commit", "run (2 × H200)", "steps timed",
                           "real tokens/s per GPU", "MFU vs the bf16 peak", "median step s", "fastest–slowest step s",
                           "steps over 1.5 × median", "peak GiB", "vs our bf16 of the call"], rows)


def fp8_own_8b_2gpu() -> str:
    """The tenth session's two 8B calls with our float8 linears."""
    return _own_8b_table(OWN_8B)


def fp8_own_8b_2gpu_more() -> str:
    """The eleventh session's four 8B calls, the same benchmark at 9193fe8."""
    return _own_8b_table(OWN_8B_MORE)


def _fp8_over_bf16(path: str) -> tuple[float, dict]:
    record = load_result(path)["fp8_8b"]
    return record["fp8"]["real_tokens_per_s"] / record["bf16"]["real_tokens_per_s"], record


def fp8_own_8b_calls() -> str:
    """FP8 against bf16 over every 8B call with our float8 linears (both sessions): the spread of the per-call
    ratios, and the ratio of all timed tokens over all timed seconds (both sides time the same 16 steps of the
    same packs)."""
    ratios, records = zip(*(_fp8_over_bf16(path) for path in OWN_8B + OWN_8B_MORE))
    pooled = {side: sum(r[side]["real_tokens"] for r in records) / sum(r[side]["seconds"] for r in records)
              for side in ("bf16", "fp8")}
    row = [str(len(ratios)), ", ".join(f"{ratio:.3f}" for ratio in ratios), f"{min(ratios):.3f}",
           f"{statistics.median(ratios):.3f}", f"{statistics.mean(ratios):.3f}", f"{max(ratios):.3f}",
           f"{sum(ratio >= FP8_TARGET for ratio in ratios)} of {len(ratios)}", f"{pooled['fp8'] / pooled['bf16']:.3f}"]
    return markdown_table(["calls", "FP8 / bf16 of each call", "min", "median", "mean", "max",
                           f"calls ≥ {FP8_TARGET}", "all timed tokens / all timed seconds, FP8 / bf16"], [row])


def fp8_amax_in_graph() -> str:
    """The amax experiment: our float8 linears in one 8B layer with their amaxes computed by our Triton kernel
    (2f17f47) or as torch reductions in the compiled graph, two calls on one H200, each commit in both."""
    rows = []
    for path, where in AMAX_LAYER.items():
        r = load_result(path)
        row = next(row for row in r["rows"] if row["variant"] == "fp8-own")
        by_kind = row["kernel_ms"]
        rows.append([f"`{path.split('/', 1)[1]}`", r["provenance"]["commit"][:7], where, f"{row['ms']:.2f}",
                     f"{by_kind['compiled elementwise']:.2f}", f"{by_kind['other']:.2f}",
                     f"{by_kind['compiled elementwise'] + by_kind['other']:.2f}"])
    return markdown_table(["file (bench/results/h200/…)", "commit", "amax", "layer ms (fwd + bwd)", "compiled ms",
                           "other ms", "compiled + other ms"], rows)


def fp8_gemms_stacked() -> str:
    """The FP8 GEMMs of one layer's q/k/v and gate/up linears one by one against stacked (bench/kernels/gpu_fp8_gemms.py)."""
    rows = []
    for path in FP8_GEMMS:
        r = load_result(path)
        for group, row in r["groups"].items():
            rows.append([f"`{path.split('/', 1)[1]}`", r["shape"], f"{r['tokens']:,}", group,
                         " + ".join(f"{width:,}" for width in row["widths"]), f"{row['separate_ms']:.3f}",
                         f"{row['stacked_ms']:.3f}", f"{row['separate_ms'] / row['stacked_ms']:.2f}×",
                         f"{row['separate_tflops']:,.0f}", f"{row['stacked_tflops']:,.0f}"])
    return markdown_table(["file (bench/results/h200/…)", "shape", "tokens", "group", "widths", "one by one ms",
                           "stacked ms", "one by one / stacked", "TFLOP/s one by one", "TFLOP/s stacked"], rows)


def parity_own() -> str:
    """Learning parity of our float8 linears against bf16: each side's runs (one per GPU), mean and ratio."""
    return _parity_sides(OWN_PARITY, "side (1B, 2 × H200, our float8 linears)")


PARITY_TABLES: dict[str, Callable[[], str]] = {
    "parity-runs": parity_runs, "parity-spread": parity_spread, "parity-fullacc": parity_fullacc,
    "fp8-layer-8b": fp8_layer_8b, "fp8-own-layer-8b": fp8_own_layer_8b, "fp8-own-8b-2gpu": fp8_own_8b_2gpu,
    "parity-own": parity_own, "fp8-own-8b-2gpu-more": fp8_own_8b_2gpu_more,
    "fp8-own-8b-calls": fp8_own_8b_calls, "fp8-amax-in-graph": fp8_amax_in_graph,
    "fp8-gemms-stacked": fp8_gemms_stacked,
}
