"""ops: operating runs after submission (`sft-launch status/runs/logs/cancel/plot`): run directories, scontrol/squeue.
May import contract, launcher.resolve, launcher.usage and launcher.runrecord; never plan, execute or commands (no torch)."""
