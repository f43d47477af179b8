"""execute: a `Launch` -> a rendered run directory (templates/), started by an executor (sbatch, local, submitit).
May import contract, launcher.resolve, launcher.plan and launcher.runrecord; never commands or ops."""
