"""The training command line, built once for every executor.

`accelerate launch ... -m train --config RUN/train.toml` (train/__main__.py). The local executor and
the submitit task run it with concrete values; launch.slurm renders it with shell expressions
(`"$SLURM_NODEID"`, positional arguments) that each node expands itself (`shell_words`).

With `--attempt NAME` each training process writes its whole output to its rank log
(contract.protocol.rank_logs_dir); the node's launcher stderr (torchrun's ChildFailedError traceback)
goes to the launcher log next to it: the local executor and the submitit task open that file, the
batch script's node command redirects into it (`node_shell`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

from contract import protocol

TRAIN_MODULE = "train"  # what `accelerate launch -m` runs
ACCELERATE_CLI = ("accelerate", "launch")  # on PATH on the compute nodes (or in the container)


def accelerate_of_this_python() -> tuple[str, ...]:
    """`accelerate launch` of the running interpreter (no reliance on PATH)."""
    return (sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch")


def train_command(accelerate_config: str, train_config: str, *, num_machines: str | int, machine_rank: str | int,
                  num_processes: str | int, main_ip: str, main_port: str | int, rdzv_timeout_s: str | int | None = None,
                  accelerate: tuple[str, ...] = ACCELERATE_CLI, attempt: str | None = None) -> list[str]:
    """argv of one node's training launcher; `rdzv_timeout_s` None keeps torchrun's default; `attempt`
    None leaves the ranks' output on the launcher's streams (no rank logs)."""
    rdzv = ["--rdzv_conf", f"timeout={rdzv_timeout_s}"] if rdzv_timeout_s is not None else []
    rank_logs = ["--attempt", attempt] if attempt is not None else []
    return [
        *accelerate, "--config_file", accelerate_config,
        "--num_machines", str(num_machines), "--machine_rank", str(machine_rank),
        "--num_processes", str(num_processes),
        "--main_process_ip", main_ip, "--main_process_port", str(main_port), *rdzv,
        "-m", TRAIN_MODULE, "--config", train_config, *rank_logs,
    ]


def shell_words(argv: list[str]) -> str:
    """argv with shell expressions (`$1`, `$SLURM_NODEID`) double-quoted so each node expands them;
    the other words are plain flags and names that need no quoting."""
    return " ".join(f'"{word}"' if "$" in word else word for word in argv)


def node_shell(argv: list[str], rank_logs: str, host: str) -> str:
    """One node's shell command: create the attempt's rank-log directory, then run `argv` with its
    stderr (torchrun's own messages and traceback) appended to this node's launcher log there."""
    launcher_log = f"{rank_logs}/{protocol.launcher_log_name(host)}"
    return f'mkdir -p "{rank_logs}" && exec {shell_words(argv)} 2>>"{launcher_log}"'


def open_launcher_log(run_dir: Path, attempt: str, host: str) -> BinaryIO:
    """This node's launcher log of the attempt (created with its directory), for a launcher process's
    stderr: the local executor and the submitit task pass it to Popen."""
    directory = Path(protocol.rank_logs_dir(str(run_dir), attempt))
    directory.mkdir(parents=True, exist_ok=True)
    return open(directory / protocol.launcher_log_name(host), "ab", buffering=0)
