"""The CLI through real subprocesses: exit codes, one-line errors, no run dir on bad input, sbatch
results, secrets never rendered, and no torch on the login-node path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher.conftest import EXAMPLE_CLUSTER, REPO, cli_env, path_without, rendered_dir, run_cli, write_stub


def _no_sbatch_env(**extra: str) -> dict[str, str]:
    return cli_env(PATH=path_without("sbatch"), **extra)


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sft-launch: error: "), result.stderr
    return lines[0]


def test_help_and_models(tmp_path: Path) -> None:
    assert run_cli(["--help"], tmp_path).returncode == 0
    from contract import __version__

    version = run_cli(["--version"], tmp_path)  # not "the following arguments are required: --model"
    assert version.returncode == 0 and version.stdout == f"sft-launch {__version__}\n", version.stdout + version.stderr
    models = run_cli(["models"], tmp_path)
    assert models.returncode == 0
    for name in ("tiny", "llama-7b", "llama-13b", "llama-70b", "llama3-8b", "llama3-70b", "llama3.2-1b",
                 "mistral-7b", "qwen2.5-7b"):
        assert f"\n{name} " in models.stdout


@pytest.mark.parametrize(("args", "expected"), [
    (["--model", "llama3-8bb", "--executor", "local"], "did you mean: llama3-8b"),
    (["--model", "tiny", "--executor", "local", "--nodes", "0"], "--nodes 0: must be >= 1"),
    (["--model", "tiny", "--executor", "local", "--nodes", "2"], "--nodes: the local executor"),
    (["--model", "tiny", "--executor", "local", "--time", "1:2:3:4"], "--time: bad time limit"),
    (["--model", "tiny", "--executor", "local", "--set", "train.lerning_rate=1"], "did you mean: learning_rate"),
    (["--model", "tiny", "--executor", "local", "--learning_rate", "abc"], "train.learning_rate: expected float"),
    (["--model", "tiny", "--executor", "local", "--set", "profile.gpus_per_node=-1"], "gpus_per_node: must be >= 0"),
    (["--model", "tiny", "--executor", "local", "--set", "bogus.x=1"], "--set bogus.x: unknown key"),
    (["--model", "tiny", "--executor", "local", "--set", "profile.env.HF_TOKEN=abc"], "export it in your shell"),
    (["--model", "tiny", "--executor", "local", "--strategy", "zero3"], "DeepSpeed needs GPUs"),
    (["--model", "tiny", "--executor", "local", "--strategy", "fsdp1"],
     "--strategy fsdp1: FSDP1 needs GPUs (its rank-0 weight broadcast, sync_module_states, is GPU-only); "
     "CPU profiles (gpus_per_node = 0) support only fsdp (FSDP2 over gloo)"),
    (["--model", "tiny"], "cluster.example.toml"),
    (["--model", "tiny", "--executor", "local", "--set", "train.fused_mlp=true"],
     "train.fused_mlp: cannot be used: it runs only on CUDA GPUs"),
])
def test_config_errors_exit_2_with_one_line_and_no_run_dir(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run_cli([*args, "--output", str(tmp_path / "run")], tmp_path, env=_no_sbatch_env())
    assert result.returncode == 2, result.stderr
    assert expected in _error_line(result)
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_cluster_file_errors_name_the_toml_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('default_profile = "gpu"\n\n[profiles.gpu]\npartition = "p"\ngpus_per_node = 8\n'
                       'gpu_type = "v100"\n\n[profiles.gpu.container]\nkind = "pyxis"\n')
    result = run_cli(["--model", "tiny", "--dry-run"], tmp_path, env=_no_sbatch_env())
    assert result.returncode == 2
    assert _error_line(result).endswith("cluster.toml:8: [profiles.gpu] container.image: required when kind = 'pyxis'")
    cluster.write_text(cluster.read_text().replace('kind = "pyxis"', 'kind = "none"\nimage = 3'))
    assert "cluster.toml:10: [profiles.gpu] container.image: expected str" in _error_line(
        run_cli(["--model", "tiny", "--dry-run"], tmp_path, env=_no_sbatch_env()))
    cluster.write_text(cluster.read_text().replace("image = 3", ""))
    flash = run_cli(["--model", "tiny", "--dry-run", "--set", "model.attn_implementation=flash_attn"], tmp_path,
                    env=_no_sbatch_env())
    assert "flash_attn needs compute capability >= 8.0; v100 has 7.0" in _error_line(flash)
    fused = run_cli(["--model", "tiny", "--dry-run", "--set", "train.fused_mlp=true"], tmp_path, env=_no_sbatch_env())
    assert fused.returncode == 2
    assert _error_line(fused).endswith("train.fused_mlp: cannot be used: it needs Hopper or Blackwell "
                                       "(compute capability 9.0-10.3; this GPU has 7.0)")
    cluster.write_text('# my profiles\ndefault_profile = "gpu"\n\n[profile.gpu]\ngpus_per_node = 8\n')  # profile.
    singular = run_cli(["--model", "tiny", "--dry-run"], tmp_path, env=_no_sbatch_env())
    assert "cluster.toml:4: unknown top-level key 'profile'" in _error_line(singular)


def test_dry_run_without_sbatch_prints_summary(roomy_tmp: Path) -> None:
    result = run_cli(["--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100", "--model", "llama3-8b", "--nodes", "2",
                      "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4", "--dry-run",
                      "--output", str(roomy_tmp / "run")], roomy_tmp, env=_no_sbatch_env())
    assert result.returncode == 0, result.stderr
    assert "2 node(s) x 8 GPU (a100) = world size 16" in result.stdout
    assert "global batch 128" in result.stdout and "sbatch not found" in result.stdout
    assert not (roomy_tmp / "run").exists(), "a dry run writes no run directory"
    assert f"a launch would create {roomy_tmp / 'run'}" in result.stdout
    assert (rendered_dir(result) / "launch.slurm").is_file() and (rendered_dir(result) / "train.toml").is_file()


def test_submit_records_job_id_and_sbatch_refusal_exits_1(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    write_stub(bin_dir, "sbatch", 'if [[ "$*" == *--parsable* ]]; then pwd > "$STUB_CWD"; echo 31337; exit 0; fi\n'
                                  'echo "sbatch: error: should not be called" >&2; exit 1\n')
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{path_without('sbatch')}", STUB_CWD=str(tmp_path / "cwd"))
    args = ["--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu", "--model", "tiny", "--output", str(tmp_path / "run")]
    result = run_cli(args, tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "submitted job 31337" in result.stdout
    assert "sft-launch logs run -f" in result.stdout and "sft-launch status run" in result.stdout
    assert (tmp_path / "cwd").read_text().strip() == str(tmp_path / "run"), "sbatch runs in the run dir"
    assert json.loads((tmp_path / "run" / "run.json").read_text())["job_ids"] == ["31337"]
    write_stub(bin_dir, "sbatch", 'echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1\n')
    write_stub(bin_dir, "squeue", "exit 0\n")  # job 31337 is over: the run may be launched again
    refused = run_cli(args, tmp_path, env=env)
    assert refused.returncode == 1
    assert _error_line(refused) == "sft-launch: error: sbatch: sbatch: error: Batch job submission failed: Invalid account"


def test_same_command_reuses_the_same_run_dir(tmp_path: Path) -> None:
    args = ["--model", "tiny", "--executor", "local", "--dry-run", "--max_steps", "5"]
    first = run_cli(args, tmp_path)
    second = run_cli(args, tmp_path)
    other = run_cli([*args[:-1], "6"], tmp_path)
    assert first.returncode == second.returncode == other.returncode == 0
    run_dirs = [re.search(r"a launch would create (\S+)", r.stdout)[1] for r in (first, second, other)]
    assert run_dirs[0] == run_dirs[1] != run_dirs[2]
    assert all(Path(d).name.startswith("local-tiny-") for d in run_dirs)
    assert not (tmp_path / "runs").exists(), "dry runs leave no run directory behind"


def test_secrets_in_the_environment_never_reach_rendered_files(roomy_tmp: Path) -> None:
    secrets = {"WANDB_API_KEY": "wandb-secret-9f8e7d", "HF_TOKEN": "hf_secret_1a2b3c"}
    result = run_cli(["--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100", "--model", "llama3-8b", "--dry-run",
                      "--report_to", "wandb", "--output", str(roomy_tmp / "run")], roomy_tmp,
                     env=_no_sbatch_env(**secrets))
    assert result.returncode == 0, result.stderr
    for path in rendered_dir(result).rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert not any(value in text for value in secrets.values()), path


def test_login_node_paths_do_not_import_torch(tmp_path: Path) -> None:
    probe = (
        "import sys, contextlib, io\n"
        "import launcher, launcher.cli\n"
        "assert 'torch' not in sys.modules, 'import launcher'\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        launcher.cli.main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    assert 'torch' not in sys.modules, '--help'\n"
        f"    code = launcher.cli.main(['--model', 'tiny', '--executor', 'local', '--dry-run', '--output', {str(tmp_path / 'r')!r}])\n"
        "assert code == 0, code\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'deepspeed') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=_no_sbatch_env(), capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_runrecord_module_cli(tmp_path: Path) -> None:
    run_json = tmp_path / "run.json"
    env = cli_env(SLURM_JOB_ID="77", SLURM_RESTART_COUNT="3")
    result = subprocess.run([sys.executable, "-m", "launcher.runrecord", str(run_json), "requeue", "kind=timeout",
                             "timeouts=2"], env=env, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    data = json.loads(run_json.read_text())
    assert data["job_ids"] == ["77"]
    assert {k: data["events"][0][k] for k in ("event", "kind", "timeouts", "restart")} == {
        "event": "requeue", "kind": "timeout", "timeouts": 2, "restart": 3}


def _slurm_reachable() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slurm
@pytest.mark.skipif(not _slurm_reachable(), reason="no reachable SLURM controller (tests/slurm/cluster.sh up)")
def test_dry_run_test_only_against_local_slurm(tmp_path: Path) -> None:
    base = ["--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu", "--model", "tiny", "--dry-run", "--time", "10",
            "--set", "profile.cpus_per_task=0", "--set", 'profile.mem=""']
    accepted = run_cli([*base, "--output", str(tmp_path / "ok")], tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    assert "sbatch --test-only: sbatch: Job" in accepted.stdout
    refused = run_cli([*base, "--set", "profile.partition=no-such-partition", "--output", str(tmp_path / "bad")],
                      tmp_path)
    assert refused.returncode == 1 and "invalid partition" in _error_line(refused)


def test_set_and_flag_values_that_look_like_numbers_stay_text_where_a_text_is_expected(tmp_path: Path) -> None:
    """`--set profile.account=12345` (HPC accounts are often numbers), `profile.mem=64000` (MB), `profile.time=90`
    (minutes) and `--profile_steps 5` are what sbatch and the docs take; the TOML literal they parse as is an
    integer, which was refused ("expected str, got 12345") unless quoted twice."""
    result = run_cli(["--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu", "--model", "tiny", "--dry-run",
                      "--output", str(tmp_path / "run"), "--set", "profile.account=12345", "--set",
                      "profile.mem=64000", "--set", "profile.time=90", "--set", "profile.env.SEED_TAG=7",
                      "--profile_steps", "5"], tmp_path, env=_no_sbatch_env())
    assert result.returncode == 0, result.stderr
    rendered = rendered_dir(result)
    script = (rendered / "launch.slurm").read_text()
    assert "#SBATCH --account=12345\n" in script and "#SBATCH --mem=64000\n" in script, script
    assert "#SBATCH --time=0-01:30:00\n" in script and "SEED_TAG=7" in script, script
    assert 'profile_steps = "5"' in (rendered / "train.toml").read_text()
    wrong = run_cli(["--cluster", str(EXAMPLE_CLUSTER), "--profile", "cpu", "--model", "tiny", "--dry-run",
                     "--output", str(tmp_path / "run"), "--set", "profile.gpus_per_node=two"], tmp_path,
                    env=_no_sbatch_env())  # an integer field still wants an integer
    assert wrong.returncode == 2 and "gpus_per_node: expected an integer, got 'two'" in wrong.stderr, wrong.stderr
