"""The process contract's shared rules, exercised the way each consumer uses them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contract import protocol
from contract.command import accelerate_of_this_python, shell_words, train_command

REPO = Path(__file__).resolve().parents[2]


def _checkpoint(root: Path, step: int, mtime: float) -> Path:
    path = root / protocol.checkpoint_name(step)
    path.mkdir(parents=True)
    (path / protocol.CHECKPOINT_MARKER).write_text("ok\n")
    os.utime(path / protocol.CHECKPOINT_MARKER, (mtime, mtime))
    return path


def _shell_says(code: int, stop: Path, checkpoints: Path, run_dir: Path, since: float = 0.0) -> int:
    """The batch shell's question, asked as launch.slurm asks it: the exit code training meant."""
    return int(subprocess.run([sys.executable, "-m", "contract.protocol", "exit-code", str(code), str(stop),
                               str(checkpoints), str(run_dir), str(since)], cwd=REPO, capture_output=True, text=True,
                              timeout=60, check=True).stdout)


def test_checkpointed_after_stop_in_python_and_for_the_batch_shell(tmp_path: Path) -> None:
    stop, root = tmp_path / protocol.STOP_FILE, tmp_path / protocol.CHECKPOINT_DIR
    assert not protocol.checkpointed_after_stop(stop, root) and _shell_says(1, stop, root, tmp_path) == 1  # no request
    stop.touch()
    os.utime(stop, (1000.0, 1000.0))
    _checkpoint(root, 10, mtime=900.0)  # older than the request: does not answer it
    (root / protocol.checkpoint_name(30)).mkdir()  # no marker: never counts
    assert not protocol.checkpointed_after_stop(stop, root) and _shell_says(1, stop, root, tmp_path) == 1
    assert protocol.training_exit_code(1, stop, root, tmp_path, 0.0) == 1
    _checkpoint(root, 20, mtime=1000.0)  # same second as the request: answers it
    assert protocol.checkpointed_after_stop(stop, root)
    assert _shell_says(1, stop, root, tmp_path) == protocol.EXIT_REQUEUE  # torchrun's 1 -> 75
    assert protocol.training_exit_code(1, stop, root, tmp_path, 0.0) == protocol.EXIT_REQUEUE
    assert protocol.training_exit_code(0, stop, root, tmp_path, 0.0) == 0


def test_a_run_that_finished_in_this_attempt_is_done_whatever_the_launcher_says(tmp_path: Path) -> None:
    """A preemption during the export: the ranks finish it, torchrun exits 1 for its own SIGTERM. Requeueing would
    train everything again (no checkpoint of the last step); a FINISHED older than the attempt says nothing."""
    stop, root, finished = tmp_path / protocol.STOP_FILE, tmp_path / protocol.CHECKPOINT_DIR, tmp_path / "FINISHED"
    finished.write_text('{"step": 40}')
    os.utime(finished, (2000.0, 2000.0))
    assert _shell_says(1, stop, root, tmp_path, since=1999.5) == 0
    assert protocol.training_exit_code(143, stop, root, tmp_path, since=2000.0) == 0
    assert _shell_says(1, stop, root, tmp_path, since=2001.0) == 1  # a previous attempt's
    assert protocol.training_exit_code(75, stop, root, tmp_path, since=0) == 75


def test_the_helper_refuses_a_wrong_call_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "contract.protocol", "checkpointed-after-stop", "a", "b"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == protocol.EXIT_USAGE and proc.stderr.count("\n") == 1 and not proc.stdout


def test_checkpoint_names_and_master_port() -> None:
    assert protocol.checkpoint_name(50) == "step-00000050"
    assert protocol.checkpoint_step(Path("step-00000050")) == 50
    assert protocol.checkpoint_step(Path(".tmp-step-00000050")) is None
    assert protocol.master_port("123456") == 20000 + 123456 % 10000
    assert protocol.master_port("123456_7", fixed=29400) == 29400
    assert protocol.log_name("42", 1) == "42-r1.log"


def test_one_training_command_for_every_executor() -> None:
    argv = train_command("/r/accelerate.yaml", "/r/train.toml", num_machines=2, machine_rank=1, num_processes=4,
                         main_ip="node1", main_port=20042, rdzv_timeout_s=900, accelerate=accelerate_of_this_python())
    assert argv[:4] == [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"]
    assert " ".join(argv[4:]) == ("--config_file /r/accelerate.yaml --num_machines 2 --machine_rank 1 "
                                  "--num_processes 4 --main_process_ip node1 --main_process_port 20042 "
                                  "--rdzv_conf timeout=900 -m train --config /r/train.toml")
    local = train_command("a", "t", num_machines=1, machine_rank=0, num_processes=2, main_ip="127.0.0.1", main_port=1)
    assert "--rdzv_conf" not in local and local[:2] == ["accelerate", "launch"]
    assert shell_words(["--num_processes", "$2", "timeout=$5"]) == '--num_processes "$2" "timeout=$5"'
