"""sbatch options declared once on the profile, for launch.slurm and submitit alike, with a validated pass-through."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.schema import ConfigError
from launcher.resolve.options import LaunchRequest, resolve
from launcher.resolve.profile import ClusterProfile
from launcher.execute.render import render_files
from launcher.resolve.sbatch_options import profile_options
from launcher.execute.submitit_exec import executor_parameters
from tests.launcher.conftest import EXAMPLE_CLUSTER


def _launch(tmp_path: Path, *sets: str, executor: str = "sbatch"):
    return resolve(LaunchRequest(model="llama3-8b", profile="a100", cluster=str(EXAMPLE_CLUSTER), executor=executor,
                                 output=str(tmp_path / "run"), sets=list(sets)))


def test_pass_through_reaches_the_batch_script_and_submitit(tmp_path: Path) -> None:
    sets = ("profile.sbatch.mail-type=END,FAIL", "profile.sbatch.overcommit=true", "profile.qos=high")
    launch = _launch(tmp_path, *sets)
    lines = [line for line in render_files(launch)["launch.slurm"].splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --mail-type=END,FAIL" in lines and "#SBATCH --overcommit" in lines
    assert lines.index("#SBATCH --qos=high") < lines.index("#SBATCH --mail-type=END,FAIL") < lines.index(
        "#SBATCH --output=logs/slurm-%j.out")
    params = executor_parameters(_launch(tmp_path, *sets, executor="submitit"))
    assert params["qos"] == "high" and params["exclusive"] is True and params["gpus_per_node"] == 8
    assert params["additional_parameters"] == {"requeue": True, "mem": "0", "mail-type": "END,FAIL",
                                               "overcommit": True}


@pytest.mark.parametrize(("option", "expected"), [
    ("profile.sbatch.partition=x", "sbatch.partition: use the profile key 'partition' instead"),
    ("profile.sbatch.time=10", "sbatch.time: set by sft-launch itself"),
    ("profile.sbatch.--mail-type=END", "sbatch.--mail-type: an sbatch long option name"),
    ("profile.sbatch.comment='a b'", "has characters sbatch cannot take literally"),
    ("profile.sbatch.overcommit=false", "leave the option out instead"),
])
def test_pass_through_is_validated_like_the_rest(tmp_path: Path, option: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace("'", "'")):
        _launch(tmp_path, option)


def test_the_profile_fields_declare_their_sbatch_options() -> None:
    flags = {option.key: option.flag for option in profile_options(ClusterProfile())}
    assert flags == {"partition": "partition", "account": "account", "qos": "qos", "reservation": "reservation",
                     "constraint": "constraint", "exclusive": "exclusive", "gpus_per_node": "gpus-per-node",
                     "cpus_per_task": "cpus-per-task", "mem": "mem"}
