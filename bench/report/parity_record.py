"""The results record of bench/suites/gpu_parity.py: sides and their repeats, the comparisons, the tables, the plot,
and `--merge` (several results files of one config, e.g. one per GPU, as one record).

A side run once keeps its flat result (`losses`, the timing, `eval_loss`): the shape of every file written
before --repeat. A side run N > 1 times (--repeat, or pooled by --merge):

    {"eval_loss": mean of eval_losses, "eval_losses": [one per repeat that finished],
     "real_tokens_per_s": mean over the timed repeats, "runs": [each repeat's flat result + "run" (its run
     directory: SIDE, SIDE.2, ...) and, when merged, "file" (the results file it came from)]}

A comparison judges a side's mean against its reference's mean; where either side has several repeats it also
records each one's count and spread ((max - min) / mean of its eval losses): a reference spread above the 1%
target means one such comparison cannot resolve 1%.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

TARGET = 0.01  # eval loss within 1%
CONFIG_KEYS = ("shape", "steps", "budget", "lr", "warmup_ratio", "train_docs", "eval_docs", "gpu")
LEGACY_WARMUP_RATIO = 0.03  # files written before --warmup-ratio (d70026a) ran this warm-up
SIDE_IDENTITY = ("attention", "packs")  # what a TRL run records about itself: pooled runs of a side must agree


def run_name(side: str, repeat: int) -> str:
    """A repeat's run directory (and its name in the record): SIDE, SIDE.2, SIDE.3, ..."""
    return side if repeat == 1 else f"{side}.{repeat}"


def runs_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A side's runs: its `runs`, or the side itself where it ran once."""
    return result.get("runs", [result])


def eval_losses(result: dict[str, Any]) -> list[float]:
    return [run["eval_loss"] for run in runs_of(result) if "eval_loss" in run]


def spread(values: list[float]) -> float | None:
    """(max - min) / mean: how far repeats of one side lie apart (None below two repeats)."""
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else None


def side_entry(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side of the record from its runs (flat results, `side` dropped): see the module doc."""
    runs = [{k: v for k, v in run.items() if k != "side"} for run in runs]
    if len(runs) == 1:
        return {k: v for k, v in runs[0].items() if k != "run"}
    entry: dict[str, Any] = {}
    if losses := [run["eval_loss"] for run in runs if "eval_loss" in run]:
        entry |= {"eval_loss": statistics.fmean(losses), "eval_losses": losses}
    else:
        entry["error"] = f"all {len(runs)} repeats failed"
    if rates := [run["real_tokens_per_s"] for run in runs if run.get("real_tokens_per_s")]:
        entry["real_tokens_per_s"] = statistics.fmean(rates)
    return entry | {"runs": runs}


def reference_of(side: str, sides: dict[str, dict[str, Any]]) -> str | None:
    """The side each one is judged against: ours vs TRL (flex, else SDPA), FP8 vs our bf16, a switch vs
    the plain path."""
    if side == "ours":
        return next((t for t in ("trl", "trl-sdpa", "trl-bfd") if "eval_loss" in sides.get(t, {})), "trl")
    if side.startswith("ours-fp8"):
        return "ours"
    return "ours-plain" if side.startswith("ours-plain+") else None


def comparisons(sides: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Eval loss ratio of every side's mean to its reference's (and speed ratio where both were timed);
    with repeats, both sides' counts and spreads."""
    rows = []
    for side, result in sides.items():
        ref = reference_of(side, sides)
        if ref not in sides or "eval_loss" not in result or "eval_loss" not in sides[ref]:
            continue
        ratio = result["eval_loss"] / sides[ref]["eval_loss"]
        speed = result.get("real_tokens_per_s"), sides[ref].get("real_tokens_per_s")
        row = {"side": side, "reference": ref, "eval_loss_ratio": ratio, "within_target": abs(ratio - 1) <= TARGET,
               "speedup": speed[0] / speed[1] if all(speed) else None}
        ours, theirs = eval_losses(result), eval_losses(sides[ref])
        if max(len(ours), len(theirs)) > 1:
            row |= {"repeats": len(ours), "spread": spread(ours),
                    "reference_repeats": len(theirs), "reference_spread": spread(theirs)}
        rows.append(row)
    return rows


def config_of(record: dict[str, Any], name: str) -> dict[str, Any]:
    if "sides" not in record:
        raise ValueError(f"{name}: not a bench/suites/gpu_parity.py results file (no `sides`)")
    return {key: record.get(key, LEGACY_WARMUP_RATIO if key == "warmup_ratio" else None) for key in CONFIG_KEYS}


def merge(records: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One record of several results files of one config (CONFIG_KEYS): each side's runs pooled in file
    order, the comparisons derived again, every input's provenance kept under `merged_from`. Raises
    ValueError (one line naming the file and key) on files of different configs or differing runs of a side."""
    if len({name for name, _ in records}) < len(records):
        raise ValueError("two files of one name: their runs could not be told apart")
    (first, config), pooled = (records[0][0], config_of(records[0][1], records[0][0])), {}
    merged_from: list[dict[str, Any]] = []
    for name, record in records:
        for key, value in config_of(record, name).items():
            if value != config[key]:
                raise ValueError(f"{name}: {key} = {value!r}, but {first} has {config[key]!r}: not one config")
        for side, result in record["sides"].items():
            for repeat, run in enumerate(runs_of(result), 1):
                pooled.setdefault(side, []).append({**run, "run": run.get("run", run_name(side, repeat)),
                                                    "file": run.get("file", name)})
        merged_from += record.get("merged_from", [{"file": name, "provenance": record.get("provenance")}])
    for side, runs in pooled.items():
        for key in SIDE_IDENTITY:
            if len({repr(run.get(key)) for run in runs}) > 1:
                seen = ", ".join(f"{run.get(key)!r} in {run['file']}" for run in runs)
                raise ValueError(f"side {side}: its runs differ in {key} ({seen}): not one side")
    sides = {side: side_entry(runs) for side, runs in pooled.items()}
    return {**config, "sides": sides, "comparisons": comparisons(sides), "merged_from": merged_from}


def loss_table(sides: dict[str, dict[str, Any]], every: int) -> list[str]:
    """Train loss every `every` steps, one column per side (the mean over its repeats)."""
    curves = {s: [run["losses"] for run in runs_of(r) if run.get("losses")] for s, r in sides.items()}
    curves = {s: c for s, c in curves.items() if c}
    steps = max((len(c) for runs in curves.values() for c in runs), default=0)
    lines = ["| step | " + " | ".join(f"{s} (mean of {len(c)})" if len(c) > 1 else s for s, c in curves.items())
             + " |", "|---|" + "---|" * len(curves)]
    for step in sorted({*range(every, steps + 1, every), 1, steps} - {0}):
        cells = []
        for runs in curves.values():
            values = [c[step - 1] for c in runs if step <= len(c)]
            cells.append(f"{statistics.fmean(values):.4f}" if values else "")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def summary_lines(record: dict[str, Any]) -> list[str]:
    """Per side: mean eval loss, each repeat's, their spread, the verdict against the reference, speed; then
    a note for every comparison where either side's repeats spread wider than the target."""
    lines = ["| side | eval loss (mean) | each repeat | spread | vs | ratio | within 1% | real tokens/s | speed vs |",
             "|---|---|---|---|---|---|---|---|---|"]
    judged = {c["side"]: c for c in record["comparisons"]}
    for side, result in record["sides"].items():
        if "eval_loss" not in result:
            lines.append(f"| {side} | error: {result.get('error')} | | | | | | | |")
            continue
        losses, row = eval_losses(result), judged.get(side)
        each = ", ".join(f"{v:.4f}" for v in losses) if len(losses) > 1 else "-"
        rate = f"{result['real_tokens_per_s']:,.0f}" if result.get("real_tokens_per_s") else "-"
        verdict = "- | - | -" if row is None else \
            f"{row['reference']} | {row['eval_loss_ratio']:.4f} | {'yes' if row['within_target'] else 'NO'}"
        speed = f"{row['speedup']:.2f}x" if row and row["speedup"] else "-"
        lines.append(f"| {side} | {result['eval_loss']:.4f} | {each} | {_percent(spread(losses))} | {verdict} | "
                     f"{rate} | {speed} |")
    for row in record["comparisons"]:
        known = {name: value for name, value in ((row["side"], row.get("spread")),
                                                 (row["reference"], row.get("reference_spread"))) if value is not None}
        if known and max(known.values()) > TARGET:
            spreads = ", ".join(f"{name} {value:.1%}" for name, value in known.items())
            lines.append(f"note: {row['side']} vs {row['reference']}: repeats spread {spreads} (> {TARGET:.0%}): "
                         f"noise this large cannot resolve a {TARGET:.0%} target")
    return lines


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def plot(record: dict[str, Any], png: Path) -> Path | None:
    """Train loss per step of every repeat of every side (one colour a side, thin lines for repeats), the
    mean eval losses in the legend."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib not installed: no plot (python -m bench.suites.gpu_parity --plot FILE.json makes it)")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for index, (side, result) in enumerate(record["sides"].items()):
        curves = [run["losses"] for run in runs_of(result) if run.get("losses")]
        label = side if "eval_loss" not in result else f"{side} (eval {result['eval_loss']:.4f}" + \
            (f", mean of {len(eval_losses(result))})" if "runs" in result else ")")
        for repeat, losses in enumerate(curves):
            ax.plot(range(1, len(losses) + 1), losses, color=f"C{index}", label=None if repeat else label,
                    linewidth=1 if len(curves) == 1 else 0.6, alpha=1 if len(curves) == 1 else 0.7)
    ax.set(xlabel="optimizer step", ylabel="train loss", yscale="log",
           title=f"{record['shape']}: {record['steps']} steps x {record['budget']} tokens, same init and data")
    ax.legend()
    fig.savefig(png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return png
