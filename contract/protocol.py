"""The process contract: run-directory names, exit codes, the stop/cancel file protocol, the master port.

Everything here is read or written by more than one process (batch shell, local executor, submitit
task, `sft-launch status/cancel`, the training ranks), so each name and rule is written once.

The batch shell asks this module (``python -m contract.protocol exit-code CODE STOP CKPT RUN SINCE``)
instead of re-implementing the rule in bash; it prints the exit code training meant, so that a Python
that cannot run (no answer at all) is told apart from an answer.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

# Exit codes of `sft-launch` and of `python -m train`.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # bad configuration or command line
# A training process that saved a checkpoint because it was asked to stop (EX_TEMPFAIL): the batch
# shell requeues the job, the local executor tells the user to run the same command again.
EXIT_REQUEUE = 75
# A training process whose progress watchdog or a collective timeout fired: some rank stopped making
# progress (a dead or hung node suspected). The batch shell looks for the node to blame (#15).
EXIT_HUNG = 76

# Run directory layout (docs/ARCHITECTURE.md). Names relative to the run directory.
LAUNCH_SCRIPT = "launch.slurm"
ACCELERATE_CONFIG = "accelerate.yaml"
DEEPSPEED_CONFIG = "deepspeed.json"
TRAIN_CONFIG = "train.toml"
RUN_RECORD = "run.json"
LOGS_DIR = "logs"
CANCEL_FILE = "CANCEL_REQUESTED"  # `sft-launch cancel`: checkpoint, then do not requeue
# LOGS_DIR/ROSTER_FILE: one JSON line per training rank and (re)start (rank, host, pid, job, restart):
# which host ran which rank, for blaming a node whose ranks went silent (contract/liveness.py).
ROSTER_FILE = "ranks.jsonl"
# LOGS_DIR/HEARTBEAT_DIR/rank-NNNNN.json: each rank's last completed step and last sign of life.
HEARTBEAT_DIR = "heartbeats"
# LOGS_DIR/RANK_LOGS_DIR/<attempt>/: every training rank's whole output (rank_log_name) and each
# node's launcher (accelerate/torchrun) stderr (launcher_log_name). The main log keeps local rank 0's
# progress and the one failure line; tracebacks and other ranks' follow-on errors stay here.
RANK_LOGS_DIR = "ranks"
SRUN_LOG = "srun.log"  # RANK_LOGS_DIR/<attempt>/: srun's own messages (the batch log shows them on failure)
LOCAL_ATTEMPT_PREFIX = "local-"
# Defaults of the [run] keys that name files (contract.config.RunSection).
STOP_FILE = "STOP_REQUESTED"
# RUN/FINISHED_FILE: written by training's rank 0 once the last step, the final eval and the export are done
# ({"step": N}), removed when training starts. Newer than an attempt's start, it means "this attempt finished"
# whatever the launcher's exit code says (torchrun turns a SIGTERM it got after the last step, say a preemption
# during the export, into a failure of its own): the job must not be requeued to train it all again.
FINISHED_FILE = "FINISHED"
CHECKPOINT_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
EXPORT_DIR = "export"
# LOGS_DIR/NODE_FAILURES_FILE: one line per node the batch shell blamed and excluded (#15):
# "JOB RESTART NODE REASON..."; its length is what max_node_failures caps.
NODE_FAILURES_FILE = "node_failures.txt"
# LOGS_DIR/ATTEMPT_FILE: "JOB RESTART START_EPOCH" of the attempt running now; the batch shell removes
# it when it decides the outcome itself, so finding it at start means SLURM ended the previous attempt
# (a node failure requeued by SLURM): the next start asks for the node to blame then.
ATTEMPT_FILE = "attempt.txt"
# The wall-clock epoch at which this attempt of the job began, exported to the training processes by the
# batch script (its first command: bash's $EPOCHREALTIME, whose decimal point follows the locale) and by the
# local executor: a rank's startup record counts its phases from it (train/observe/startup.py; #53).
JOB_START_ENV = "SFT_LAUNCH_JOB_START"
# LOGS_DIR/BATCH_FAILURES_FILE: one line per failure the batch shell itself saw (a setup line, scontrol,
# the helpers' python): "JOB RESTART EPOCH EXIT_CODE WHAT..." (`sft-launch status` shows the newest).
BATCH_FAILURES_FILE = "batch_failures.txt"
# BATCH_HELPERS_DIR/: a copy of the stdlib-only modules the batch shell runs (contract.protocol,
# contract.blame, contract.failure, launcher.runrecord, ...), written at submission, so that the node's
# python needs no installed sft-launch (with a container, the package lives in the image only).
BATCH_HELPERS_DIR = ".batch-helpers"
# LOGS_DIR/PROFILE_DIR/steps-A-B.trace.json: the Chrome/Perfetto trace of train.profile_steps (rank 0).
PROFILE_DIR = "profile"
# COMPILE_CACHE_DIR/: torch.compile's caches (Inductor's FX graphs and AOT autograd, Triton's kernels) of every
# (re)start, in the run directory: a requeued job, on whatever node, finds the graphs its first start compiled
# (torch's default, /tmp/torchinductor_<user>, is node-local and often wiped between jobs).
COMPILE_CACHE_DIR = ".compile-cache"

# `sft-launch eval` results: EVAL_DIR/<name>.json; EVAL_DIR/pinned-step-N is a checkpoint hard-linked
# by `eval --every-checkpoint` until its export (train/export_checkpoint.py) removes it.
EVAL_DIR = "eval"
EVAL_PINNED_PREFIX = "pinned-step-"
# The eval task that is ours, not lm-eval's: each data source's held-out loss (train/engine/heldout.py),
# stored under this key of the results file.
EVAL_HELDOUT_TASK = "heldout"

# Checkpoints: CHECKPOINT_DIR/step-00000050/ is complete only once it holds CHECKPOINT_MARKER.
CHECKPOINT_PREFIX = "step-"
CHECKPOINT_TMP_PREFIX = ".tmp-step-"
CHECKPOINT_MARKER = "COMPLETE"
# train.async_save: of the RAM a node has available, the share its ranks' staged shards may take (the page cache,
# the data loader and the writer's buffers need the rest); more, and auto staging goes to node-local disk.
STAGING_RAM_SHARE = 0.8

# MASTER_PORT when the profile fixes none: derived from the job id, outside the ephemeral range
# (32768+), so jobs sharing a node do not collide. launch.slurm renders the same two numbers.
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 10000


def is_run_dir(path: Path) -> bool:
    """A directory a launch rendered: it holds run.json or train.toml."""
    return (path / RUN_RECORD).is_file() or (path / TRAIN_CONFIG).is_file()


def is_exported_model(path: Path) -> bool:
    """A directory `from_pretrained` loads: a full model (config.json) or a LoRA adapter in PEFT's format
    (adapter_config.json naming its base model; transformers loads the base, then the adapter)."""
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def free_port() -> int:
    """A free TCP port on this host, for a rendezvous that stays on this machine (local runs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def attempt_name(job_id: str, restart: int | str) -> str:
    """<jobid>-r<restart>: one (re)start of a job. Also rendered with shell expressions for the batch script."""
    return f"{job_id}-r{restart}"


def local_attempt_name(started: float) -> str:
    """A local run's attempt: its start time (local executor), unique per run of the command."""
    return LOCAL_ATTEMPT_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.localtime(started))


def write_json_atomically(path: Path, record: dict) -> bool:
    """Write `record` to a temporary name beside `path`, then rename: a reader (another process, another
    node) never sees half a file. False, leaving no temporary behind, when it cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)
        return True
    except OSError:
        tmp.unlink(missing_ok=True)
        return False


def log_name(job_id: str, restart: int) -> str:
    """logs/<jobid>-r<restart>.log: one file per (re)start."""
    return f"{attempt_name(job_id, restart)}.log"


def rank_logs_dir(run_dir: str, attempt: str) -> str:
    """RUN/logs/ranks/<attempt>; strings, so the batch script can render it with shell expressions."""
    return f"{run_dir}/{LOGS_DIR}/{RANK_LOGS_DIR}/{attempt}"


def rank_log_name(rank: int) -> str:
    return f"rank-{rank:05d}.log"


def launcher_log_name(host: str) -> str:
    return f"launcher-{host}.log"


def checkpoint_name(step: int, prefix: str = CHECKPOINT_PREFIX) -> str:
    return f"{prefix}{step:08d}"


def periodic_save_due(step: int, save_steps: int, total_steps: int) -> bool:
    """Whether optimizer step `step` ends with a periodic checkpoint (train.save_steps): a multiple of save_steps
    before the run's last step (the end of training has its own save)."""
    return step % save_steps == 0 and step < total_steps


def periodic_save_ahead(step: int, save_steps: int, total_steps: int) -> bool:
    """Whether a periodic checkpoint falls after `step` (where a run starts or resumes): without one, an asynchronous
    writer would never be used (train/engine/loop.py starts none; launcher/plan/saves.py says so)."""
    return periodic_save_due((step // save_steps + 1) * save_steps, save_steps, total_steps)


def checkpoint_step(path: Path) -> int | None:
    """The step of a checkpoint directory name, None for anything else."""
    digits = path.name.removeprefix(CHECKPOINT_PREFIX)
    return int(digits) if path.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() else None


def master_port(job_id: str, fixed: int = 0) -> int:
    return fixed or MASTER_PORT_BASE + int(job_id.split("_")[0]) % MASTER_PORT_SPAN


def answers_stop(checkpoint: Path, stop_file: Path) -> bool:
    """The complete checkpoint `checkpoint` was written after (in answer to) the stop request."""
    marker = checkpoint / CHECKPOINT_MARKER
    return marker.is_file() and stop_file.exists() and marker.stat().st_mtime >= stop_file.stat().st_mtime


def checkpointed_after_stop(stop_file: Path, checkpoint_dir: Path) -> bool:
    """A complete checkpoint newer than the stop request: "checkpointed, requeue me".

    torchrun reports any non-zero worker exit as its own exit 1, so the 75 of the training processes
    does not survive `accelerate launch`; every executor recovers it from the file system with this.
    """
    if not stop_file.exists():
        return False
    markers = checkpoint_dir.glob(f"{CHECKPOINT_PREFIX}*/{CHECKPOINT_MARKER}")
    return any(answers_stop(marker.parent, stop_file) for marker in markers)


def finished_since(run_dir: Path, since: float) -> bool:
    """Training wrote the run's FINISHED_FILE at or after `since` (an attempt's start, epoch seconds)."""
    try:
        return (run_dir / FINISHED_FILE).stat().st_mtime >= since
    except OSError:
        return False


def training_exit_code(code: int, stop_file: Path, checkpoint_dir: Path, run_dir: Path, since: float) -> int:
    """The exit code of a training run as the executors report it: 0 when the attempt that started at `since`
    finished training (see FINISHED_FILE), 75 when it checkpointed after the stop request (see
    checkpointed_after_stop), else `code`."""
    if code in (EXIT_OK, EXIT_REQUEUE):
        return code
    if finished_since(run_dir, since):
        print(f"sft-launch: training finished ({FINISHED_FILE} written) although its launcher exited with {code}: "
              "counting it as 0", file=sys.stderr)
        return EXIT_OK
    return EXIT_REQUEUE if checkpointed_after_stop(stop_file, checkpoint_dir) else code


USAGE = "usage: python -m contract.protocol exit-code CODE STOP_FILE CHECKPOINT_DIR RUN_DIR SINCE_EPOCH"


def main(argv: list[str]) -> int:
    """`python -m contract.protocol exit-code ...` (USAGE): prints the exit code training meant."""
    try:
        command, code, stop_file, checkpoint_dir, run_dir, since = argv
        if command != "exit-code":
            raise ValueError(command)
        print(training_exit_code(int(code), Path(stop_file), Path(checkpoint_dir), Path(run_dir), float(since)))
    except ValueError:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
