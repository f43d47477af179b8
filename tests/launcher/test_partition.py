"""The job against its partition (launcher/partition.py), on recorded `scontrol show partition -o` and
`sinfo -o %G` output, and the plan's CPU lines (issue #32). The real-cluster check:
tests/slurm/test_run_ownership.py."""

from __future__ import annotations

import dataclasses

from launcher.commands.plan_cmd import plan_launch
from launcher.ops.partition import parse_partition, problems
from launcher.resolve.options import LaunchRequest, resolve
from tests.launcher.conftest import EXAMPLE_CLUSTER

# SLURM 22.05 on the test cluster (tests/slurm/cluster.sh up --nodes 3)
TEST_CLUSTER = ("PartitionName=cpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
                "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MaxNodes=UNLIMITED "
                "MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED Nodes=node[1-3] PriorityJobFactor=1 "
                "PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP "
                "TotalCPUs=48 TotalNodes=3 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
                "MaxMemPerNode=UNLIMITED TRES=cpu=48,mem=192G,node=3,billing=48")
GPU_PARTITION = TEST_CLUSTER.replace("PartitionName=cpu", "PartitionName=gpu").replace(
    "MaxNodes=UNLIMITED", "MaxNodes=4").replace("MaxTime=UNLIMITED", "MaxTime=2-00:00:00").replace(
    "TotalNodes=3", "TotalNodes=64")


def _launch(profile: str = "a100", nodes: int = 2, time: str | None = None, *sets: str):
    return resolve(LaunchRequest(model="llama3-8b" if profile != "cpu" else "tiny", nodes=nodes,
                                 cluster=str(EXAMPLE_CLUSTER), profile=profile, time=time, output="/tmp/x",
                                 sets=list(sets)))


def test_partition_fields_are_read() -> None:
    part = parse_partition(GPU_PARTITION, "gpu:a100:8(S:0-1),shard:4\ngpu:a100:4\n")
    assert (part.name, part.total_nodes, part.max_nodes, part.max_time_s, part.gpus_per_node) == \
        ("gpu", 64, 4, 2 * 86400, 8)
    cpu = parse_partition(TEST_CLUSTER, "(null)\n")
    assert (cpu.total_nodes, cpu.max_nodes, cpu.max_time_s, cpu.gpus_per_node, cpu.grace_time_s) == \
        (3, None, None, 0, 0)
    assert parse_partition("PartitionName=x TotalNodes=1", "").grace_time_s is None  # not said


def test_each_limit_is_named() -> None:
    gpu = parse_partition(GPU_PARTITION, "gpu:a100:8\n")
    assert problems(_launch(nodes=2), gpu) == []
    assert problems(_launch(nodes=8), gpu) == [
        "--nodes 8: partition gpu allows at most 4 node(s) per job (MaxNodes)"]
    assert problems(_launch(nodes=2, time="3-00:00:00"), gpu) == [
        "--time 3-00:00:00: partition gpu allows at most 2-00:00:00 (MaxTime; set --time or profile.time)"]
    assert problems(_launch(nodes=2), dataclasses.replace(gpu, gpus_per_node=4)) == [
        "profile.gpus_per_node = 8: partition gpu has 4 GPU(s) per node"]
    cpu = parse_partition(TEST_CLUSTER, "(null)\n")
    assert problems(_launch(nodes=3), cpu) == ["profile.gpus_per_node = 8: partition cpu has no GPUs (GRES gpu)"]
    assert problems(_launch("cpu", nodes=4), cpu) == ["--nodes 4: partition cpu has 3 node(s)"]


def test_cpu_plan_checks_mem_and_shows_no_gpu_rows() -> None:
    launch = _launch("cpu", 1, None, "profile.mem=4G")
    text = plan_launch(launch).text
    assert "CPU RAM node 0            2.00   of 3.60 usable" in text, text
    for gpu_word in ("nccl", "NCCL", "allocator slack", "GPU-hours", "single GPU"):
        assert gpu_word not in text, gpu_word
    small = plan_launch(_launch("cpu", 1, None, "profile.mem=1G"))
    assert small.plan.fits_cpu is False and not small.fits


def test_the_signal_line_is_the_lead_the_script_asks_for() -> None:
    launch = _launch("cpu", 1, None, "profile.signal_lead_s=120")
    line = next(x for x in plan_launch(launch).text.splitlines() if x.startswith("Signal"))
    assert line.startswith("Signal  120 s before the limit (profile.signal_lead_s;"), line
    from launcher.execute.render import render_files

    assert "#SBATCH --signal=B:USR1@120" in render_files(launch)["launch.slurm"]
