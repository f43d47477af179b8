"""submitit executor pieces that need no cluster: parameters, the per-node command, pickling, API handle."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from tests.launcher.ops_fixtures import make_run

from launcher import api
from launcher.resolve.options import LaunchRequest, resolve
from launcher.execute.submitit_exec import TrainTask, executor_parameters, make_task

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests" / "slurm" / "cluster.toml"


def cpu_launch(tmp_path: Path):
    return resolve(LaunchRequest(model="tiny", nodes=2, cluster=str(CLUSTER), profile="cpu", executor="submitit",
                                 output=str(tmp_path / "run")))


def test_executor_parameters_follow_the_profile(tmp_path: Path) -> None:
    launch = cpu_launch(tmp_path)
    params = executor_parameters(launch)
    assert (params["nodes"], params["ntasks_per_node"], params["time"]) == (2, 1, 60)
    assert params["signal_delay_s"] == 60 and params["partition"] == "cpu" and params["cpus_per_task"] == 1
    assert "exclusive" not in params and params["additional_parameters"] == {"requeue": True}
    assert "export SUBMITIT_PREEMPT_SIGNAL=USR1" in params["setup"]
    assert "export GLOO_SOCKET_IFNAME=eth0" in params["setup"]


def test_task_command_and_pickle_drop_the_running_child(tmp_path: Path) -> None:
    task = make_task(cpu_launch(tmp_path))
    command = task.command(node_rank=1, nnodes=2, master_addr="node1", port=20042, attempt="7-r0")
    joined = " ".join(command)
    assert "--num_machines 2 --machine_rank 1 --num_processes 2" in joined
    assert "--main_process_ip node1 --main_process_port 20042" in joined
    assert command[-6:] == ["-m", "train", "--config", str(tmp_path / "run" / "train.toml"), "--attempt", "7-r0"]
    task._exit_code = 75
    copy = pickle.loads(pickle.dumps(task))
    assert isinstance(copy, TrainTask) and copy._exit_code is None and copy._child is None
    assert copy.run_dir == task.run_dir and copy.stop_wait_s == 50


def test_api_handle_on_an_existing_run(tmp_path: Path) -> None:
    handle = api.attach(make_run(tmp_path, finished=True))
    assert handle.job_id == "900042"
    assert "restart 1 on node1" in handle.logs()
    assert all("[rank 1]" in line or "task 1" in line for line in handle.logs(restart=0, node=1).splitlines())
    with pytest.raises(FileNotFoundError):
        api.attach(tmp_path / "nothing")
    with pytest.raises(ValueError, match="executor"):
        api.submit("tiny", executor="local")
