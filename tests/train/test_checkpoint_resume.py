"""Preemption: stop request → checkpoint → exit 75 → restart equals an uninterrupted run (bitwise on
CPU, same world size); kill -9 in the middle of a save → resume from the previous complete one.
The 2 ranks shard with FSDP2 over gloo (train.engine.sharding), so the checkpoints are the sharded DCP
layout GPU runs write; each test asserts it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import torch
from tests.train.run_helpers import (kill_job, assert_sharded_checkpoint, exported_tensors, launch_command, launch_env, metrics,
                                     read_log, run_training, write_run)

from contract.protocol import EXIT_REQUEUE, JOB_START_ENV, checkpointed_after_stop
from tests.faults import KILL_IN_COPY_STEP_ENV, SLOW_SAVE_S_ENV
from tests.faults import SLOW_SAVE_STEP_ENV as TEST_SLOW_SAVE_STEP_ENV
from tests.faults import STOP_AT_STEP_ENV as TEST_STOP_AT_STEP_ENV
from tests.train.conftest import TINY_ARCH, TINY_TOKENIZER_DIR
from train.observe.startup import PHASES
from train.persist.layout import MARKER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, dict]:
    """The runs fine-tune a saved tiny Llama (model.path), as a user's runs do: a resume then builds the model
    without reading it (train/engine/model.py weights_in_checkpoint), so bitwise equality with the
    uninterrupted run also proves that the checkpoint alone restores every weight."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("pretrained")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**TINY_ARCH)).save_pretrained(folder)
    return {"model": {"path": str(folder), "arch": {}, "tokenizer": str(TINY_TOKENIZER_DIR)}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, pretrained) -> Path:
    """One uninterrupted 30-step run that the interrupted runs must reproduce. It must learn: a resume
    that reproduces a run whose optimizer never steps would prove nothing."""
    # Collections every 10 steps (default 50): metrics' gc_s shows them; they never change the numbers.
    run_dir = write_run(tmp_path_factory.mktemp("reference"), {**pretrained, "train": {"gc_every_steps": 10}})
    assert run_training(run_dir) == 0, read_log(run_dir)
    curve = losses(run_dir)
    assert curve[max(curve)] < curve[min(curve)] - 0.5, f"the loss does not drop: {curve}"
    return run_dir


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    got, want = exported_tensors(run_dir), exported_tensors(reference)
    assert got.keys() == want.keys() and got
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), f"{name} differs from the uninterrupted run"


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def test_stop_request_checkpoints_exits_75_and_resumes_bitwise(tmp_path, reference, pretrained):
    """The stop at step 7 finds the asynchronous save of step 5 still writing (tests/faults stalls it until then):
    it finishes that one instead of starting another, exits 75, and the restart redoes steps 6-7 bitwise
    (a save at a logging step: the metrics windows of both runs cover the same steps)."""
    run_dir = write_run(tmp_path / "run", {**pretrained, "train": {"save_steps": 5}})
    code = run_training(run_dir, {TEST_STOP_AT_STEP_ENV: "7", TEST_SLOW_SAVE_STEP_ENV: "5", SLOW_SAVE_S_ENV: "60"},
                        log_name="first.log")
    first_log = read_log(run_dir, "first.log")
    # Each worker exits 75, which torchrun reports as its own 1; the launcher recovers the requeue
    # from the file system with this rule (launch.slurm has the same one in shell).
    assert code in (EXIT_REQUEUE, 1) and "exitcode  : 75" in first_log, first_log
    assert "stop: finishing the checkpoint of step 5 in flight" in first_log
    assert checkpointed_after_stop(run_dir / "STOP_REQUESTED", run_dir / "checkpoints")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000005"]
    assert_sharded_checkpoint(run_dir / "checkpoints" / "step-00000005", world=2)
    assert not (run_dir / "export").exists()

    job_start = time.time()
    assert run_training(run_dir, {JOB_START_ENV: repr(job_start)}, log_name="second.log") == 0, \
        read_log(run_dir, "second.log")
    assert_startup_records(run_dir, time.time() - job_start)
    assert "resumed from" in read_log(run_dir, "second.log")
    assert "every weight comes from step-00000005" in read_log(run_dir, "second.log")  # model.path not read
    assert not (run_dir / "STOP_REQUESTED").exists()  # the stale request was cleared on restart
    assert losses(run_dir) == losses(reference)  # the whole curve, before and after the stop
    assert_same_weights(run_dir, reference)


def assert_startup_records(run_dir: Path, resume_wall_s: float) -> None:
    """One startup record per start (train/observe/startup.py): the resume's counts from the job start it was
    given, every phase in order and none negative, their sum its total, within the resume's wall time."""
    first, resumed = [r for r in metrics(run_dir) if r.get("event") == "startup"]
    assert not first["resumed"] and first["phases"]["checkpoint_load"] < 0.1  # nothing to load: no time
    assert (resumed["resumed"], resumed["origin"], resumed["step"]) == (True, "job", 6)
    phases = resumed["phases"]
    assert list(phases) == list(PHASES) and min(phases.values()) >= 0 and phases["launch"] > 0, phases
    assert abs(sum(phases.values()) - resumed["total_s"]) < 1e-6 and resumed["total_s"] <= resume_wall_s, resumed
    assert f"startup (resume): {resumed['total_s']:.1f} s from job start" in read_log(run_dir, "second.log")


def test_kill_during_save_resumes_from_previous_complete_checkpoint(tmp_path, reference, pretrained):
    """train.async_save (the default): the save of step 10 is staged, its write stalls in the background
    thread (tests/faults: before its rename) while training goes on to step 15, whose save waits for it
    (one in flight); the whole job is killed there. Step 5 stays the complete one; the next start removes
    the partial step 10 and resumes bitwise."""
    run_dir = write_run(tmp_path / "run", {**pretrained, "train": {"save_steps": 5, "save_total_limit": 2}})
    ckpts = run_dir / "checkpoints"
    with open(run_dir / "first.log", "w") as log:
        proc = subprocess.Popen(launch_command(run_dir), cwd=run_dir, env=launch_env({TEST_SLOW_SAVE_STEP_ENV: "10"}),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            # Step 15's metrics record: training went on while the write of step 10 was in flight.
            while not (run_dir / "metrics.jsonl").exists() or 15 not in losses(run_dir):
                assert proc.poll() is None and time.monotonic() < deadline, read_log(run_dir, "first.log")
                time.sleep(0.2)
            assert (ckpts / ".tmp-step-00000010" / "train_state.json").exists()
        finally:
            kill_job(proc)  # the whole job, mid-write: as a node failure would
    assert "checkpoint of step 10 staged" in read_log(run_dir, "first.log")
    assert "each save is staged in CPU memory" in read_log(run_dir, "first.log")  # auto: the node's RAM holds it
    assert (ckpts / "step-00000005" / MARKER).is_file()
    assert_sharded_checkpoint(ckpts / "step-00000005", world=2)
    assert not (ckpts / "step-00000010").exists()

    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    log = read_log(run_dir, "second.log")
    assert "step-00000005 (step 5" in log and "removing incomplete checkpoint" in log
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00000020", "step-00000025"]  # last K kept
    assert_sharded_checkpoint(ckpts / "step-00000025", world=2)
    assert_same_weights(run_dir, reference)


def test_a_rank_killed_mid_copy_of_a_disk_staged_save_leaves_the_previous_one(tmp_path, reference, pretrained):
    """train.async_save_staging = "disk": each save is written to node-local storage (run.node_local_dir) in the
    pause and copied into the checkpoint dir in the background. Rank 1 dies mid-copy of step 10's save (tests/faults:
    after its first file); the job fails with step 5 complete. The next start removes the partial .tmp-step-10 and
    what the dead run left staged on the node, resumes from step 5 bitwise, and stages every later save the same way."""
    local = tmp_path / "node-local"
    run_dir = write_run(tmp_path / "run", {**pretrained, "train": {"save_steps": 5, "async_save_staging": "disk"},
                                           "run": {"node_local_dir": str(local)}})
    ckpts = run_dir / "checkpoints"
    assert run_training(run_dir, {KILL_IN_COPY_STEP_ENV: "10"}, log_name="first.log") != 0
    first = read_log(run_dir, "first.log")
    assert "each save is staged on node-local disk" in first and "train.async_save_staging = disk" in first, first
    assert (ckpts / "step-00000005" / MARKER).is_file() and not (ckpts / "step-00000010").exists(), first
    assert list(local.rglob("*.distcp")), "the dead run left nothing staged: the kill came too late to test"
    partial = (ckpts / ".tmp-step-00000010").exists()  # unless the surviving rank removed it on its way out

    assert run_training(run_dir, log_name="second.log") == 0, read_log(run_dir, "second.log")
    second = read_log(run_dir, "second.log")
    assert "step-00000005 (step 5" in second and ("removing incomplete checkpoint" in second) == partial
    assert "removing the partial node-local staging" in second
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-00000020", "step-00000025"]
    assert_sharded_checkpoint(ckpts / "step-00000025", world=2)
    assert not list(local.iterdir()), "the run left staged files behind"
    saves = [r for r in metrics(run_dir) if r.get("event") == "checkpoint" and r["step"] > 5]
    assert {(r["mode"], r["staging"]) for r in saves} == {("async", "disk")}, saves
    assert_same_weights(run_dir, reference)


def test_reference_run_trains_logs_and_exports(reference):
    """The uninterrupted 2-rank run: the loss falls, metrics.jsonl has the contract's keys, and the
    export is a Hugging Face directory that loads and generates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert "world size 2 (DistributedType.FSDP)" in read_log(reference)
    records = [r for r in metrics(reference) if "loss" in r]
    assert records[-1]["loss"] < records[0]["loss"] - 1.0
    assert {"tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "packing_efficiency", "restart", "gc_s",
            "slowest_step", "slowest_step_s"} <= set(records[0])
    assert all(r["step"] - 5 < r["slowest_step"] <= r["step"] and r["slowest_step_s"] > 0 for r in records)  # every 5
    assert sum(r["gc_s"] for r in records) > 0  # the collections at steps 10, 20 and 30
    assert records[0]["mfu"] is None  # CPU: no peak FLOP/s, no guess
    assert metrics(reference)[-1]["event"] == "done"
    export = reference / "export"
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert tokenizer.chat_template
    model = AutoModelForCausalLM.from_pretrained(export)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_empty_export_dir_finishes_without_exporting(tmp_path):
    """run.export_dir = "" (benchmarks) ends the run after its last step: no full-model gather, no files."""
    run_dir = write_run(tmp_path / "run", {"train": {"max_steps": 2, "logging_steps": 1}, "run": {"export_dir": ""}})
    assert run_training(run_dir) == 0, read_log(run_dir)
    assert metrics(run_dir)[-1]["event"] == "done"
    assert not list(run_dir.rglob("*.safetensors")) and not (run_dir / "config.json").exists()
