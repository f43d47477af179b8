"""`sft-launch runs [--cluster F --profile P | --root DIR]`: one line per run under the storage root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.schema import ConfigError
from launcher.ops import evalresults, rundir, slurm, status
from launcher.resolve.options import DEFAULT_CLUSTER_FILE
from launcher.usage import Parser


def list_runs(root: Path) -> list[dict[str, Any]]:
    """Status of every run directory directly under `root`, newest update first.

    One `squeue` call answers for every job; jobs it does not list fall back to run.json (not one
    `sacct` call per run: `status RUN` asks accounting).
    """
    try:
        states = slurm.job_states()
    except slurm.SlurmUnavailable:
        states = {}

    def query(job_id: str) -> dict[str, str] | None:
        return {"JobState": states[job_id]} if job_id in states else None

    def row(path: Path) -> dict[str, Any]:
        try:
            return status.run_status(path, query, lambda _: None)
        except RuntimeError as err:  # e.g. its run.json is not JSON: say so on its line, list the others
            return {"name": path.name, "state": f"UNREADABLE ({str(err).removeprefix(str(path) + '/')})",
                    "step": None, "total_steps": None, "loss": None, "eval": None, "updated": None}

    runs = [row(path) for path in sorted(root.iterdir()) if rundir.is_run_dir(path)] if root.is_dir() else []
    return sorted(runs, key=lambda r: r["updated"] or "", reverse=True)


def format_runs(runs: list[dict[str, Any]]) -> str:
    rows = [("NAME", "STATE", "STEP", "LOSS", "EVAL", "UPDATED")]
    for run in runs:
        step = "-" if run["step"] is None else str(run["step"])
        if run["total_steps"]:
            step += f"/{run['total_steps']}"
        loss = "-" if run["loss"] is None else f"{run['loss']:.4f}"
        rows.append((run["name"], run["state"], step, loss, evalresults.short(run.get("eval")),
                     run["updated"] or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5]
                     for row in rows)


def main(argv: list[str]) -> int:
    parser = Parser(prog="sft-launch runs", description="List the runs under the storage root.")
    rundir.add_root_arguments(parser)
    args = parser.parse_args(argv)
    root = rundir.storage_root(args)
    runs = list_runs(root)
    if not runs and not args.root and not args.cluster and not Path(DEFAULT_CLUSTER_FILE).is_file():
        # As a launch does: without a cluster file there is no storage root to look in (only the
        # embedded local profile's, which holds no runs either).
        raise ConfigError(f"no ./{DEFAULT_CLUSTER_FILE}: pass --cluster FILE or --root DIR "
                          f"(no local runs under {root} either)")
    if not runs:
        print(f"no runs under {root}")
        return 0
    print(format_runs(runs))
    return 0
