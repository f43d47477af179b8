"""The training command line, built once for every executor.

`accelerate launch ... -m train --config RUN/train.toml` (train/__main__.py). The local executor and
the submitit task run it with concrete values; launch.slurm renders it with shell expressions
(`"$SLURM_NODEID"`, positional arguments) that each node expands itself (`shell_words`).
"""

from __future__ import annotations

import sys

TRAIN_MODULE = "train"  # what `accelerate launch -m` runs
ACCELERATE_CLI = ("accelerate", "launch")  # on PATH on the compute nodes (or in the container)


def accelerate_of_this_python() -> tuple[str, ...]:
    """`accelerate launch` of the running interpreter (no reliance on PATH)."""
    return (sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch")


def train_command(accelerate_config: str, train_config: str, *, num_machines: str | int, machine_rank: str | int,
                  num_processes: str | int, main_ip: str, main_port: str | int, rdzv_timeout_s: str | int | None = None,
                  accelerate: tuple[str, ...] = ACCELERATE_CLI) -> list[str]:
    """argv of one node's training launcher; `rdzv_timeout_s` None keeps torchrun's default."""
    rdzv = ["--rdzv_conf", f"timeout={rdzv_timeout_s}"] if rdzv_timeout_s is not None else []
    return [
        *accelerate, "--config_file", accelerate_config,
        "--num_machines", str(num_machines), "--machine_rank", str(machine_rank),
        "--num_processes", str(num_processes),
        "--main_process_ip", main_ip, "--main_process_port", str(main_port), *rdzv,
        "-m", TRAIN_MODULE, "--config", train_config,
    ]


def shell_words(argv: list[str]) -> str:
    """argv with shell expressions (`$1`, `$SLURM_NODEID`) double-quoted so each node expands them;
    the other words are plain flags and names that need no quoting."""
    return " ".join(f'"{word}"' if "$" in word else word for word in argv)
