"""`--executor submitit` (launcher/execute/executors.py): the same run directory and training command, through submitit.

One submitit job with nodes=N, tasks_per_node=1: each task (a Python process on its node) builds
`accelerate launch ... -m train --config RUN/train.toml` from the SLURM variables and runs it,
appending to RUN/logs/<jobid>-r<restart>.log like the batch shell does.

Requeue protocol through submitit's checkpoint hook. sbatch gets `--signal=USR1@<signal_lead_s>`
(SUBMITIT_PREEMPT_SIGNAL=USR1, exported for the job too) and `--requeue`. SLURM (or
`scancel --signal=USR1 JOB`) delivers USR1 to the tasks; submitit's handler on task 0 calls
`TrainTask.checkpoint()`, which writes the stop file, forwards USR1 to the training processes,
waits for them to save and exit 75, records the requeue in run.json and returns a resubmission
of itself; submitit then runs `scontrol requeue` (its timeout budget = the profile's
max_timeouts; preemptions are not capped). RUN/CANCEL_REQUESTED (from `sft-launch cancel`) makes
checkpoint() return None: saved, not requeued. Training processes ignore nothing but USR2; the
accelerate/torchrun parent ignores USR1 (it would die of it), as in launch.slurm.

submitit is imported only inside functions: `launcher` stays importable without it.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from contract import protocol
from contract.command import accelerate_of_this_python, open_launcher_log, train_command
from contract.protocol import CANCEL_FILE, EXIT_REQUEUE
from contract.schema import ConfigError
from launcher import runrecord
from launcher.execute.executors import Started
from launcher.resolve.options import Launch
from launcher.execute.render import timeout_threshold_s
from launcher.resolve.sbatch_options import submitit_parameters

PREEMPT_SIGNAL = "USR1"
POLL_S = 0.5


def _ignore_stop_signals() -> None:
    # Inherited through exec by accelerate/torchrun; the training processes install their own
    # USR1/TERM handlers, so only the launcher parent keeps ignoring USR1.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class TrainTask:
    """The submitit callable (pickled into RUN/submitit/): one instance per node, same arguments."""

    def __init__(self, run_dir: Path, procs_per_node: int, rdzv_timeout_s: int, master_port: int,
                 time_limit_s: int, stop_wait_s: int, stop_file: str, checkpoint_dir: str):
        self.run_dir = str(run_dir)
        self.procs_per_node = procs_per_node
        self.rdzv_timeout_s = rdzv_timeout_s
        self.master_port = master_port
        self.time_limit_s = time_limit_s
        self.stop_wait_s = stop_wait_s
        self.stop_file = stop_file
        self.checkpoint_dir = checkpoint_dir
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._exit_code: int | None = None
        self._started = time.monotonic()
        self._started_epoch = time.time()  # FINISHED_FILE newer than this: this attempt finished training

    def __getstate__(self) -> dict[str, Any]:
        # The resubmission pickle must not carry the running child or its exit code.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    @property
    def _paths(self) -> tuple[Path, Path, Path]:
        run = Path(self.run_dir)
        return run, run / self.stop_file, run / self.checkpoint_dir

    def command(self, node_rank: int, nnodes: int, master_addr: str, port: int, attempt: str) -> list[str]:
        run = Path(self.run_dir)
        return train_command(
            str(run / protocol.ACCELERATE_CONFIG), str(run / protocol.TRAIN_CONFIG), num_machines=nnodes,
            machine_rank=node_rank, num_processes=nnodes * self.procs_per_node, main_ip=master_addr, main_port=port,
            rdzv_timeout_s=self.rdzv_timeout_s, accelerate=accelerate_of_this_python(), attempt=attempt)

    def _record(self, event: str, **fields: Any) -> None:
        try:
            runrecord.record_event(Path(self.run_dir) / protocol.RUN_RECORD, event, {"executor": "submitit", **fields})
        except OSError as err:  # bookkeeping must never fail the job
            print(f"sft-launch: run.json not updated: {err}", file=sys.stderr, flush=True)

    def _start(self) -> int:
        """Start training on this node; returns the node rank."""
        import submitit

        environment = submitit.JobEnvironment()
        node, nnodes = environment.node, environment.num_nodes
        job_id = os.environ["SLURM_JOB_ID"]
        restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        run, stop_file, _ = self._paths
        (run / protocol.LOGS_DIR).mkdir(exist_ok=True)
        # O_APPEND: the nodes share the file.
        log = open(run / protocol.LOGS_DIR / protocol.log_name(job_id, restart), "ab", buffering=0)
        if node == 0:
            stop_file.unlink(missing_ok=True)  # a stale request must not stop this run
            log.write(f"sft-launch: job {job_id} restart {restart} on {environment.hostname} (submitit)\n".encode())
            self._record("start")
        port = protocol.master_port(job_id, self.master_port)
        attempt = protocol.attempt_name(job_id, restart)
        command = self.command(node, nnodes, environment.hostnames[0], port, attempt)
        # Ranks write their own logs (--attempt); the launcher's stderr (torchrun's traceback) goes next to them.
        launcher_log = open_launcher_log(run, attempt, environment.hostname)
        self._child = subprocess.Popen(command, cwd=run, stdout=log, stderr=launcher_log,
                                       start_new_session=True, preexec_fn=_ignore_stop_signals)
        log.close()
        launcher_log.close()
        child = self._child
        # A thread reaps the child: the USR1 handler runs on the main thread and must be able to
        # wait for the exit without re-entering Popen.wait's lock.
        threading.Thread(target=lambda: setattr(self, "_exit_code", child.wait()), daemon=True).start()
        return node

    def _training_code(self) -> int:
        """Exit code of training as it meant it (contract/protocol.py training_exit_code): torchrun reports a
        worker's 75 and its own SIGTERM after the last step as failures."""
        run, stop_file, checkpoint_dir = self._paths
        return protocol.training_exit_code(self._exit_code if self._exit_code is not None else 1, stop_file,
                                           checkpoint_dir, run, self._started_epoch)

    def __call__(self) -> int:
        node = self._start()
        while self._exit_code is None:
            time.sleep(POLL_S)
        code = self._training_code()
        if node != 0:
            if code not in (0, EXIT_REQUEUE):
                raise RuntimeError(f"training on node {node} exited with {code}")
            return code  # task 0 decides about requeueing
        if code == EXIT_REQUEUE and not (Path(self.run_dir) / CANCEL_FILE).exists():
            return self._requeue_myself()  # stopped through the stop file, not through submitit's signal
        outcome = {"outcome": "cancelled"} if code == EXIT_REQUEUE else {}
        self._record("finish", exit_code=code, **outcome)
        if code not in (0, EXIT_REQUEUE):
            raise RuntimeError(f"training exited with {code}; see {self.run_dir}/logs")
        return code

    def _requeue_myself(self) -> int:
        job_id = os.environ["SLURM_JOB_ID"]
        self._record("requeue", kind="preemption")
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=60)
        time.sleep(120)  # SLURM ends this incarnation; the pickle on disk resubmits the same task
        return EXIT_REQUEUE

    def checkpoint(self) -> Any:
        """submitit's hook (task 0, on USR1): save through our stop protocol, then requeue or not."""
        from submitit.helpers import DelayedSubmission

        _, stop_file, _ = self._paths
        if self._child is None:
            return DelayedSubmission(self)  # nothing running yet: just requeue
        stop_file.touch()
        try:
            os.killpg(self._child.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self.stop_wait_s
        while self._exit_code is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        code = self._training_code() if self._exit_code is not None else EXIT_REQUEUE
        if (Path(self.run_dir) / CANCEL_FILE).exists():
            self._record("finish", exit_code=code, outcome="cancelled")
            return None  # submitit: "not requeued"; the job ends
        if code not in (0, EXIT_REQUEUE):
            self._record("finish", exit_code=code)
            return None
        timed_out = time.monotonic() - self._started >= timeout_threshold_s(self.time_limit_s)
        self._record("requeue", kind="timeout" if timed_out else "preemption")
        return DelayedSubmission(self)


def _setup_lines(launch: Launch) -> list[str]:
    profile = launch.profile
    exports = [f"export {name}={shlex.quote(value)}" for name, value in sorted(profile.env.items())]
    if profile.hf_home:
        exports.append(f"export HF_HOME={shlex.quote(profile.hf_home)}")
    exports += [f"unset {name}" for name in profile.unset_in_job]
    # The tasks read SUBMITIT_PREEMPT_SIGNAL when they import submitit.
    return [*profile.setup, *exports, f"export SUBMITIT_PREEMPT_SIGNAL={PREEMPT_SIGNAL}",
            f"cd {shlex.quote(str(launch.run_dir))}"]


def executor_parameters(launch: Launch) -> dict[str, Any]:
    """submitit SlurmExecutor.update_parameters(...) for this launch."""
    profile = launch.profile
    named, extra = submitit_parameters(profile)  # launcher/resolve/sbatch_options.py: the same table as launch.slurm
    return {
        "job_name": launch.job_name, "nodes": launch.nodes, "ntasks_per_node": 1,
        "time": max(1, math.ceil(launch.time_limit_s / 60)), "signal_delay_s": profile.signal_lead_s,
        "setup": _setup_lines(launch), "stderr_to_stdout": True,
        "additional_parameters": {"requeue": True, **extra}, **named,
    }


def make_task(launch: Launch) -> TrainTask:
    profile, run = launch.profile, launch.train.run
    return TrainTask(launch.run_dir, profile.procs_per_node, profile.rdzv_timeout_s, profile.master_port,
                     launch.time_limit_s, max(30, profile.signal_lead_s - 10), run.stop_file, run.checkpoint_dir)


def submit(launch: Launch) -> str:
    """Submit the rendered run directory through submitit; returns the job id."""
    if launch.profile.container.kind != "none":
        raise ConfigError(f"--executor submitit: container profiles ({launch.profile.container.kind}) are not "
                          "supported; use --executor sbatch")
    try:
        import submitit
        from submitit.slurm.slurm import SlurmJobEnvironment
    except ImportError:
        raise ConfigError("--executor submitit: submitit is not installed (pip install 'sft-launch[submitit]')") from None
    previous = SlurmJobEnvironment.USR_SIG
    SlurmJobEnvironment.USR_SIG = PREEMPT_SIGNAL  # read when the sbatch file is written (--signal=USR1@lead)
    try:
        executor = submitit.SlurmExecutor(folder=launch.run_dir / "submitit",
                                          max_num_timeout=launch.profile.max_timeouts)
        executor.update_parameters(**executor_parameters(launch))
        job = executor.submit(make_task(launch))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(f"submitit: {err}".splitlines()[0]) from None
    finally:
        SlurmJobEnvironment.USR_SIG = previous
    return str(job.job_id)


def check(launch: Launch, rendered: Path) -> str:
    """The executor's dry run: SLURM's check of launch.slurm, which asks for the same resources."""
    from launcher.execute import sbatch

    return sbatch.check(launch, rendered) + " (submitit)"


def start(launch: Launch) -> Started:
    from launcher.execute.sbatch import follow_hint

    job_id = submit(launch)
    return Started(protocol.EXIT_OK, f"submitted job {job_id} through submitit\n{follow_hint(launch.run_dir)}", job_id)
