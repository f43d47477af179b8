"""Shared helpers for launcher tests: the golden cases, in-process rendering, real CLI subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.resolve.options import Launch, LaunchRequest, resolve
from launcher.execute.render import render_files
from tests.filesystems import ROOMY, tmpfs

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CLUSTER = REPO / "cluster.example.toml"
GOLDEN_DIR = REPO / "tests" / "golden"


@pytest.fixture
def roomy_tmp(tmp_path: Path):
    """tmp_path on a file system with a cluster's room: a 70B run's checkpoints pass the disk check."""
    with tmpfs(tmp_path, ROOMY):
        yield tmp_path


@dataclass(frozen=True)
class Case:
    name: str
    profile: str | None  # None = the embedded local profile
    model: str
    nodes: int = 1
    strategy: str | None = None
    lora: bool = False
    sets: tuple[str, ...] = ()

    def request(self, output: str) -> LaunchRequest:
        return LaunchRequest(
            model=self.model, nodes=self.nodes, profile=self.profile, strategy=self.strategy, lora=self.lora,
            output=output, cluster=str(EXAMPLE_CLUSTER) if self.profile else None,
            executor="sbatch" if self.profile else "local", sets=list(self.sets), dry_run=True,
        )


# Every template x every example profile, plus the strategy/offload/container variants.
CASES = [
    Case("local-tiny", None, "tiny"),
    Case("cpu-tiny-2nodes", "cpu", "tiny", nodes=2),
    Case("a100-llama3-8b-fsdp", "a100", "llama3-8b", nodes=2),
    Case("a100-llama-13b-fsdp1", "a100", "llama-13b", strategy="fsdp1"),
    Case("a100-llama-70b-zero3-offload", "a100", "llama-70b", nodes=4, strategy="zero3",
         sets=("profile.cpu_offload=true",)),
    Case("a100-mistral-7b-zero2-lora", "a100", "mistral-7b", strategy="zero2", lora=True),
    Case("h100-efa-llama3-70b-pyxis", "h100-efa", "llama3-70b", nodes=8),
    Case("a100-qwen-apptainer-fixed-port", "a100", "qwen2.5-7b",
         sets=("profile.container.kind=apptainer", "profile.container.image=/shared/img/sft.sif",
               'profile.container.mounts=["/shared:/shared"]', "profile.master_port=29400")),
    # The headline commands (issue #11): the micro-batch is left to launcher/plan/autofit.py.
    Case("a100-llama-70b-2nodes-headline", "a100", "llama-70b", nodes=2),
    Case("a100-llama3-8b-1node-headline", "a100", "llama3-8b"),
]


def case_launch(case: Case, run_dir: str | None = None) -> Launch:
    return resolve(case.request(run_dir or f"/shared/runs/{case.name}"))


def render_case(case: Case) -> dict[str, str]:
    return render_files(case_launch(case))


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


def write_run(args: list[str]) -> Path:
    """The run directory a launch with these flags renders (no checks, nothing started): for tests
    that drive training themselves. A --dry-run writes no run directory."""
    from launcher.commands.launch_args import build_parser, request_from_args
    from launcher.execute.render import write_run_dir

    return write_run_dir(resolve(request_from_args(build_parser().parse_args(args))), ["sft-launch", *args])


def rendered_dir(result: subprocess.CompletedProcess[str]) -> Path:
    """The temporary directory a --dry-run rendered into (named on its output)."""
    match = re.search(r"dry run: rendered into (\S+)", result.stdout)
    assert match, result.stdout
    return Path(match[1])


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for CLI subprocesses: the repo importable, no real sbatch unless a stub is added."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env or cli_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def path_without(tool: str) -> str:
    """PATH minus the folders holding `tool` (so the CLI behaves as on a machine without SLURM)."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    return os.pathsep.join(f for f in folders if not (Path(f) / tool).exists())


def write_stub(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path
