"""The planner wired into the CLI: `sft-launch plan` (+ --json), the plan printed by every launch,
the exit-2 refusal of a launch that does not fit (unless --force), and the Launch -> PlanInput mapping."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.launcher.conftest import EXAMPLE_CLUSTER, cli_env, path_without, run_cli, write_stub
from launcher.plan.datasize import SAMPLE_BYTES, estimate_tokens, row_tokens
from launcher.plan.memory import MemoryBreakdown
from launcher.resolve.options import LaunchRequest, resolve
from launcher.commands.plan_cmd import EXIT_DOES_NOT_FIT, plan_launch, refuse_unless_fits
from contract.shape import FUSED_LOSS_CHUNK_TOKENS
from contract.config import SHIPPED_DATA
from launcher.resolve.plan_input import mem_gib, plan_input_from_launch
from contract.schema import ConfigError

A100 = ["--cluster", str(EXAMPLE_CLUSTER), "--profile", "a100"]
LLAMA70B_ONE_NODE = [*A100, "--model", "llama-70b", "--nodes", "1"]


def _env() -> dict[str, str]:
    return cli_env(PATH=path_without("sbatch"))


def _a100(model: str, nodes: int = 1, tmp: Path = Path("/shared/runs/x"), **kw: object) -> LaunchRequest:
    return LaunchRequest(model=model, nodes=nodes, cluster=str(EXAMPLE_CLUSTER), profile="a100", output=str(tmp),
                         **kw)  # type: ignore[arg-type]


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sft-launch: error: "), result.stderr
    return lines[0]


def test_plan_subcommand_prints_the_table_and_writes_nothing(tmp_path: Path) -> None:
    result = run_cli(["plan", *LLAMA70B_ONE_NODE], tmp_path, env=_env())
    assert result.returncode == EXIT_DOES_NOT_FIT, result.stderr  # the plan, and a code that says "does not fit"
    for word in ("GPU memory per GPU", "optimizer states", "activations", "Verdict DOES NOT FIT", "try: use",
                 "Data    ~", "Time ", "Signal "):
        assert word in result.stdout, word
    assert list(tmp_path.iterdir()) == []


def test_launch_that_does_not_fit_exits_2_naming_a_node_count(tmp_path: Path) -> None:
    for extra in (["--dry-run"], []):  # a dry run checks what the launch would do; a real one never reaches sbatch
        result = run_cli([*LLAMA70B_ONE_NODE, *extra, "--output", str(tmp_path / "run")], tmp_path, env=_env())
        assert result.returncode == 2, result.stderr
        line = _error_line(result)
        assert "does not fit: GPU memory" in line and "--force" in line
        assert " nodes (--nodes " in line, line
        assert "Verdict DOES NOT FIT" in result.stdout, "the plan is printed before the refusal"
        assert not (tmp_path / "run").exists()


def test_force_renders_a_launch_that_does_not_fit(tmp_path: Path) -> None:
    result = run_cli([*LLAMA70B_ONE_NODE, "--dry-run", "--force", "--output", str(tmp_path / "run")], tmp_path,
                     env=_env())
    assert result.returncode == 0, result.stderr
    assert "Verdict DOES NOT FIT" in result.stdout and "dry run: nothing submitted" in result.stdout
    rendered = re.search(r"dry run: rendered into (\S+)", result.stdout)
    assert rendered and (Path(rendered[1]) / "launch.slurm").is_file() and not (tmp_path / "run").exists()


def test_plan_json_parses_and_has_the_breakdown(tmp_path: Path) -> None:
    result = run_cli(["plan", *LLAMA70B_ONE_NODE, "--json"], tmp_path, env=_env())
    assert result.returncode == EXIT_DOES_NOT_FIT, result.stderr
    data = json.loads(result.stdout)
    assert data["job_fits"] is False
    assert set(MemoryBreakdown.TERMS) | {"total", "allocated", "peak_phase"} <= data["gpu"].keys()
    assert data["fits"] is False and data["fits_gpu"] is False and data["verdict"].startswith("does not fit")
    assert any("nodes" in s["change"] for s in data["suggestions"])
    assert data["input"]["gpu_type"] == "a100" and data["input"]["gpus_per_node"] == 8
    assert data["dataset"]["rows"] == 300 and data["time"]["steps"] >= 1 and data["signal_lead_s"] >= 60


def test_tiny_local_run_is_planned_per_cpu_process_and_never_refused(tmp_path: Path) -> None:
    result = run_cli(["--model", "tiny", "--executor", "local", "--dry-run", "--output", str(tmp_path / "run")],
                     tmp_path)
    assert result.returncode == 0, result.stderr
    assert "RAM per CPU process" in result.stdout and "DOES NOT FIT" not in result.stdout
    launch = resolve(LaunchRequest(model="tiny", cluster=str(EXAMPLE_CLUSTER), profile="cpu", nodes=2,
                                   output=str(tmp_path / "cpu")))
    report = plan_launch(launch)
    inp = report.plan.input
    assert (inp.device, inp.strategy, inp.gpus_per_node, inp.precision) == ("cpu", "ddp", 2, "fp32")
    assert inp.gpu_memory_gib == pytest.approx(8.0)  # mem = "16G" shared by 2 processes
    assert report.plan.fits is True and report.plan.time.tokens_per_s is None


def test_plan_input_maps_the_launch() -> None:
    launch = resolve(_a100("llama3-8b", nodes=2, strategy="zero3", lora=True, time="4:00:00",
                           sets=["profile.cpu_offload=true", "profile.storage_write_gbps=5.5",
                                 "data.tokens_per_micro_batch=4096", "train.gradient_checkpointing=false",
                                 "train.gradient_accumulation_steps=3", "lora.r=8"]))
    inp = plan_input_from_launch(launch)
    assert (inp.nodes, inp.gpus_per_node, inp.gpu_type, inp.strategy, inp.cpu_offload) == (2, 8, "a100", "zero3", True)
    assert (inp.lora, inp.lora_r, inp.gradient_checkpointing) == (True, 8, False)
    assert (inp.micro_batch_tokens, inp.gradient_accumulation_steps) == (4096, 3)
    assert inp.loss_chunk_tokens == FUSED_LOSS_CHUNK_TOKENS and inp.precision == "bf16"
    assert (inp.time_limit_s, inp.storage_write_gbps, inp.cpu_mem_per_node_gib) == (4 * 3600, 5.5, None)
    # an explicit per-device batch fixes the micro-batch (launcher/plan/autofit.py would halve an unfused 8B one)
    plain = plan_input_from_launch(resolve(_a100("llama3-8b", sets=["train.fused_loss=false",
                                                                    "train.per_device_train_batch_size=4"])))
    assert plain.loss_chunk_tokens == 0 and plain.micro_batch_tokens == 4 * 8192  # per-device x max length


def test_unknown_gpu_type_warns_and_is_not_refused(tmp_path: Path) -> None:
    launch = resolve(_a100("llama-70b", tmp=tmp_path / "run", sets=['profile.gpu_type=""']))
    report = plan_launch(launch)
    assert report.plan.fits is None
    assert any("no gpu_type" in w for w in report.plan.warnings)
    refuse_unless_fits(report, force=False)  # no exception


def test_short_signal_lead_warns_with_both_values_and_keeps_the_profile_value(roomy_tmp: Path) -> None:
    args = [*A100, "--model", "llama3-8b", "--nodes", "2", "--set", "profile.signal_lead_s=60", "--dry-run",
            "--output", str(roomy_tmp / "run")]
    result = run_cli(args, roomy_tmp, env=_env())
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stdout.splitlines() if line.startswith("Warning") and "signal_lead_s" in line]
    (signal,) = [line for line in result.stdout.splitlines() if line.startswith("Signal")]
    assert signal.startswith("Signal  60 s before the limit (profile.signal_lead_s; "), signal  # what the script uses
    needed = plan_launch(resolve(_a100("llama3-8b", nodes=2))).plan.signal_lead_s
    assert "= 60 s" in warning and f"the {needed} s" in warning and needed > 60
    rendered = re.search(r"dry run: rendered into (\S+)", result.stdout)
    assert rendered and "#SBATCH --signal=B:USR1@60\n" in (Path(rendered[1]) / "launch.slurm").read_text()


def test_refusal_of_a_cpu_profile_names_ram_per_process() -> None:
    launch = resolve(LaunchRequest(model="llama3-8b", cluster=str(EXAMPLE_CLUSTER), profile="cpu",
                                   output="/tmp/never-written"))
    report = plan_launch(launch)
    assert report.plan.fits is False
    with pytest.raises(ConfigError, match=r"does not fit: RAM per process.* \(.* GiB per process of 7.2 usable"):
        refuse_unless_fits(report, force=False)
    refuse_unless_fits(report, force=True)


@pytest.mark.parametrize(("mem", "gib"), [("480G", 480.0), ("16000M", 15.625), ("16000", 15.625), ("2T", 2048.0),
                                          ("0", None), ("", None), ("lots", None)])
def test_profile_mem_in_gib(mem: str, gib: float | None) -> None:
    assert mem_gib(mem) == gib


def test_dataset_estimates(tmp_path: Path) -> None:
    shipped = estimate_tokens(SHIPPED_DATA, 8192)
    assert shipped is not None and shipped.rows == 300 and shipped.exact_rows
    assert 30 < shipped.mean_tokens < 80  # short chat turns
    assert estimate_tokens(SHIPPED_DATA, 16).tokens == 300 * 16  # truncation at model_max_length
    tokens = tmp_path / "tok.json"
    tokens.write_text(json.dumps([{"input_ids": list(range(n)), "labels": list(range(n))} for n in (5, 7, 100)]))
    exact = estimate_tokens(tokens, 50)
    assert (exact.tokens, exact.rows) == (5 + 7 + 50, 3)
    row = {"messages": [{"role": "user", "content": "x" * 35}, {"role": "assistant", "content": "y" * 70}]}
    assert row_tokens(row, 10_000) == 30 + 2 * 6 + 2
    big = tmp_path / "big.jsonl"
    line = json.dumps(row) + "\n"
    big.write_text(line * (SAMPLE_BYTES // len(line) * 3))
    scaled = estimate_tokens(big, 10_000)
    assert not scaled.exact_rows and scaled.rows == pytest.approx(SAMPLE_BYTES // len(line) * 3, rel=0.01)
    assert estimate_tokens(tmp_path / "missing.jsonl", 100) is None
    assert estimate_tokens(Path("some/hub-dataset-id"), 100) is None


def test_more_time_limit_requeues_than_max_timeouts_warns(tmp_path: Path) -> None:
    launch = resolve(_a100("llama-70b", nodes=2, tmp=tmp_path / "run",
                           sets=["profile.time=1:00:00", "profile.max_timeouts=0", "train.max_steps=20000"]))
    report = plan_launch(launch)
    assert report.plan.time.requeues and report.plan.time.requeues > 0
    (warning,) = [w for w in report.plan.warnings if "max_timeouts" in w]
    assert f"~{report.plan.time.requeues} time-limit requeues but max_timeouts = 0" in warning


def test_a_partition_grace_time_shorter_than_the_save_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SLURM reachable: `scontrol show partition -o gpu` says GraceTime=30 (stubs on PATH that log each call).
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    write_stub(bin_dir, "scontrol", f'echo "scontrol $*" >> {calls}\n[[ "$*" == \'show partition -o gpu\' ]] && '
               "echo 'PartitionName=gpu Default=NO GraceTime=30 MaxNodes=4 TotalNodes=64'\n")
    write_stub(bin_dir, "sinfo", f'echo "sinfo $*" >> {calls}\necho gpu:a100:8\n')
    monkeypatch.setenv("PATH", f"{bin_dir}:{path_without('scontrol')}")
    launch = resolve(_a100("llama3-8b", nodes=2, tmp=tmp_path / "run"))
    report = plan_launch(launch)
    (warning,) = [w for w in report.plan.warnings if "GraceTime" in w]
    assert f"GraceTime=30 s, below the {report.plan.signal_lead_s} s the checkpoint save needs" in warning
    assert report.cluster and report.cluster.line.endswith(": fits")
    # one partition query serves both the cluster check and the GraceTime warning
    assert calls.read_text().splitlines() == ["scontrol show partition -o gpu", "sinfo -h -p gpu -o %G"]


def test_plan_offers_only_the_flags_that_change_a_plan(tmp_path: Path) -> None:
    """--dry-run, --force and --job-name act on a launch only: plan neither lists nor takes them; --executor
    stays (local: this machine, no time limit)."""
    shown = run_cli(["plan", "--help"], tmp_path)
    options = {line.split()[0] for line in shown.stdout.splitlines() if line.startswith("  -")}
    assert shown.returncode == 0 and "--executor" in options, shown.stdout
    for flag in ("--dry-run", "--force", "--job-name"):
        assert flag not in options and f"[{flag}" not in shown.stdout, flag
        refused = run_cli(["plan", "--model", "tiny", "--executor", "local", flag, *(["x"] * (flag == "--job-name"))],
                          tmp_path)
        assert refused.returncode == 2 and f"unknown flag {flag}" in refused.stderr, refused.stderr
    assert "[--dry-run]" in run_cli(["--help"], tmp_path).stdout  # the launch keeps them
