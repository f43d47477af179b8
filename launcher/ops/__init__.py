"""Operating runs after submission: `sft-launch status/runs/logs/cancel/plot`.

Each module has `main(argv) -> int` (registered in launcher.cli.COMMANDS). They read the run
directory (run.json, metrics.jsonl, checkpoints/, logs/) and ask SLURM with `scontrol`/`squeue`
(no accounting database needed). Nothing here imports torch; plot imports matplotlib lazily.
"""
