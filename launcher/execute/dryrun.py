"""`--dry-run`: render into a temporary directory, let the executor check it there, and say what a
launch would change in the run directory, which it leaves exactly as it was (or does not create).

The temporary directory is kept for reading (`launch.slurm`, `train.toml`, ... and `run.json` with
what a launch would record about itself) and named in the output; it is outside the storage root, so
`sft-launch runs` never lists it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from contract import protocol
from launcher import runrecord
from launcher.execute.render import TEMPLATE_NAMES, record_fields, render_files, write_files
from launcher.resolve.options import Launch

# run.json fields that describe the machine the launch runs from, not the job: not worth a line
_UNINTERESTING = ("git_sha", "python", "sft_launch_version")


def changes(launch: Launch, files: dict[str, str]) -> list[str]:
    """What a launch would do to the run directory: create it, or which files and run.json fields it
    would rewrite (whether a live job would refuse it: launcher/commands/launch.py asks ops.ownership)."""
    run_dir = launch.run_dir
    if not run_dir.exists():
        return [f"a launch would create {run_dir}"]
    changed = [name for name, text in files.items()
               if not (run_dir / name).is_file() or (run_dir / name).read_text(encoding="utf-8") != text]
    changed += [f"{name} (removed)" for name in set(TEMPLATE_NAMES) - set(files) if (run_dir / name).exists()]
    recorded = runrecord.read(run_dir / protocol.RUN_RECORD)
    fields = [key for key, value in record_fields(launch).items()
              if key not in _UNINTERESTING and key in recorded and recorded[key] != value]
    if not changed and not fields:
        return [f"a launch would resume {run_dir} with the same files"]
    return [f"a launch would resume {run_dir}, rewriting: {', '.join(changed) or 'no rendered file'}"
            + (f"; run.json: {', '.join(fields)}" if fields else "")]


def dry_run(launch: Launch, check: Callable[[Launch, Path], str]) -> str:
    """Render into a fresh temporary directory, check it there; the text to print."""
    files = render_files(launch)
    rendered = Path(tempfile.mkdtemp(prefix=f"sft-launch-dry-run-{launch.run_dir.name}-"))
    write_files(rendered, files)
    runrecord.write_atomic(rendered / protocol.RUN_RECORD, {**record_fields(launch), "dry_run_of": str(launch.run_dir)})
    return "\n".join([check(launch, rendered), f"dry run: rendered into {rendered} (the run directory is untouched)",
                      *changes(launch, files)])
