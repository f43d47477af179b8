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


def test_api_submit_refuses_what_the_cli_refuses_before_anything_is_written(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit` plans like `sft-launch`: a job that cannot fit in GPU memory is refused (ConfigError naming the
    plan), with nothing written or submitted, unless force=True; it was submitted to OOM on its nodes."""
    from contract.schema import ConfigError
    from tests.launcher.conftest import EXAMPLE_CLUSTER, path_without, write_stub

    calls = tmp_path / "sbatch-calls"
    write_stub(tmp_path / "bin", "sbatch", f'echo "$*" >> {str(calls)!r}\necho 4242\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{path_without('sbatch')}")
    with pytest.raises(ConfigError, match="plan: does not fit: GPU memory"):
        api.submit("llama-70b", nodes=1, cluster=str(EXAMPLE_CLUSTER), profile="a100", executor="sbatch",
                   output=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists() and not calls.exists()
    forced = api.submit("llama-70b", nodes=1, cluster=str(EXAMPLE_CLUSTER), profile="a100", executor="sbatch",
                        output=str(tmp_path / "run"), force=True)
    assert forced.job_id == "4242" and calls.read_text().count("\n") == 1
