"""`sft-launch plot RUN [--out PNG]`: loss, learning rate, tokens/s and MFU over steps.

Vertical dashed lines mark requeue points: the first step logged by each new restart (where the
`restart` field of metrics.jsonl changes). matplotlib is imported inside the functions (Agg
backend), never when `launcher` is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.schema import ConfigError
from launcher.ops import rundir
from launcher.usage import Parser

PANELS = (("loss", "loss"), ("lr", "learning rate"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"))


def requeue_steps(steps: list[dict[str, Any]]) -> list[int]:
    """Steps at which a new restart began logging."""
    marks = []
    for previous, record in zip(steps, steps[1:]):
        if record.get("restart", 0) != previous.get("restart", 0):
            marks.append(int(record["step"]))
    return marks


def make_figure(steps: list[dict[str, Any]], title: str) -> Any:
    """A matplotlib Figure with the four panels (axes in PANELS order)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    figure = Figure(figsize=(11, 7), layout="constrained")
    axes = figure.subplots(2, 2, sharex=True).flatten()
    marks = requeue_steps(steps)
    for axis, (key, label) in zip(axes, PANELS):
        points = [(r["step"], r[key]) for r in steps if r.get(key) is not None]
        if points:
            xs, ys = zip(*points)
            axis.plot(xs, ys, marker="." if len(points) < 50 else None, linewidth=1.2, label=label)
        else:
            axis.text(0.5, 0.5, "n/a (CPU)" if key == "mfu" else "no data", transform=axis.transAxes,
                      ha="center", va="center", fontsize=14, color="gray")
        for index, step in enumerate(marks if points else []):  # an empty panel keeps its note readable
            axis.axvline(step, color="tab:red", linestyle="--", linewidth=1,
                         label="requeue" if index == 0 else None)
        axis.set_title(label)
        if key in ("tokens_per_s", "mfu"):  # bottom row; the x axis is shared
            axis.set_xlabel("step")
        axis.grid(True, alpha=0.3)
        if key == "mfu" and points:
            axis.yaxis.set_major_formatter(PercentFormatter(1.0))
        if key == "lr":
            axis.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    if marks:
        axes[0].legend(loc="upper right")
    figure.suptitle(title)
    return figure


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch plot", description="Plot a run's training curves.")
    rundir.add_run_arguments(parser)
    parser.add_argument("--out", metavar="PNG", help="output file (default: RUN/metrics.png)")
    args = parser.parse_args(argv)
    run_dir = rundir.resolve_run(args)
    steps = rundir.step_records(rundir.read_metrics(run_dir))
    if not steps:
        raise RuntimeError(f"{run_dir}: no training steps in metrics.jsonl yet")
    out = Path(args.out) if args.out else run_dir / "metrics.png"
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: no such directory {out.parent}", "--out")
    restarts = len(requeue_steps(steps))
    figure = make_figure(steps, f"{run_dir.name}: steps {steps[0]['step']}-{steps[-1]['step']}, {restarts} requeue(s)")
    formats = figure.canvas.get_supported_filetypes()
    if out.suffix[1:].lower() not in formats:
        raise ConfigError(f"--out {out}: cannot write a {out.suffix!r} file; name one of: "
                          f"{', '.join('.' + kind for kind in formats)}", "--out")
    try:
        figure.savefig(out, dpi=100)
    except OSError as err:
        raise RuntimeError(f"--out {out}: {err.strerror or err}") from None
    print(f"wrote {out}")
    return 0
