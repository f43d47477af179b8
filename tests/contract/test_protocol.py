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


def _shell_says(stop: Path, checkpoints: Path) -> str:
    """The batch shell's question, asked as launch.slurm asks it."""
    return subprocess.run([sys.executable, "-m", "contract.protocol", "checkpointed-after-stop", str(stop),
                           str(checkpoints)], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_checkpointed_after_stop_in_python_and_for_the_batch_shell(tmp_path: Path) -> None:
    stop, root = tmp_path / protocol.STOP_FILE, tmp_path / protocol.CHECKPOINT_DIR
    assert not protocol.checkpointed_after_stop(stop, root) and _shell_says(stop, root) == "no"  # no request
    stop.touch()
    os.utime(stop, (1000.0, 1000.0))
    _checkpoint(root, 10, mtime=900.0)  # older than the request: does not answer it
    (root / protocol.checkpoint_name(30)).mkdir()  # no marker: never counts
    assert not protocol.checkpointed_after_stop(stop, root) and _shell_says(stop, root) == "no"
    assert protocol.training_exit_code(1, stop, root) == 1
    _checkpoint(root, 20, mtime=1000.0)  # same second as the request: answers it
    assert protocol.checkpointed_after_stop(stop, root) and _shell_says(stop, root) == "yes"
    assert protocol.training_exit_code(1, stop, root) == protocol.EXIT_REQUEUE  # torchrun's 1 -> 75
    assert protocol.training_exit_code(0, stop, root) == 0


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
