"""Every committed file under bench/results is a bench script's output, unedited: its derived numbers
(MFU, TFLOP/s, ratios to the peer it names, token counts, pass verdicts) must agree to rounding with
what tests/bench/test_results_kinds.py re-derives from its raw fields, kind by kind. Here: what every
file must have, whatever its kind: its name, a `provenance` block (the files written before
bench/report/results_io.py existed were removed in issue #33, see BENCHMARKS.md), only the fields its
bench script writes, the plan's prediction where it records one; the consistency of windows, token
slots and sides (issue #51); save-async.json's checks, shown failing on tampered copies; and BENCHMARKS.md's
8B stall, from the benchmark's own documents."""

from __future__ import annotations

import copy
import re
import statistics
from pathlib import Path

import pytest

from bench.report.results_io import PROVENANCE_KEYS, RESULTS, clock_start, throughput_numbers
from bench.report.speed_inputs import with_predictions
from bench.suites.speed_calibration import TOLERANCE
from bench.common.synthetic import sample_lengths
from tests.bench import results_checks as checks
from tests.bench.results_checks import FILES

SINGLE_KEYS = {  # everything bench/suites/gpu_single.py has written, ours and peers
    "path", "real_tokens", "seconds", "warmup_steps", "real_tokens_per_s", "peak_mem_gib", "steps", "final_loss",
    "recompiles_after_first_log", "gpu", "gpu_count", "peak_flops", "shape", "budget", "total_real_tokens", "docs",
    "flops_per_token", "tflops_per_gpu", "mfu", "peer", "peer_real_tokens_per_s", "ratio_vs_peer", "provenance",
    "attention", "kernels",  # the attention backend that ran; ours: the kernel lines of its train.log
    "lora_params",  # LoRA sides: adapter parameters of the 4·N + 6·N_lora FLOP count (results_io.throughput_numbers)
    "step_seconds",  # peers: each timed step's seconds (bench/peers/peer_clock.py)
    *checks.PREDICTION,  # ours: the plan's prediction (results_io.write_result, from issue #55 on)
}
DISTRIBUTION_KEYS = ("order", "sides", "runs_per_side", "ratio_median", "ratio_min", "ratio_max", "peer_low_runs")
QLORA_KEYS = {  # bench/multi/gpu_qlora.py: a 70B run's fields, or the 1-vs-2-GPU match (one, two)
    "path", "arch", "shape", "budget", "docs", "gpu", "gpu_count", "peak_flops", "lora_params", "real_tokens", "seconds",
    "warmup_steps", "real_tokens_per_s", "tokens_per_s_per_gpu", "flops_per_token", "tflops_per_gpu", "mfu", "mfu_last",
    "peak_mem_gib", "steps", "losses", "grad_norms", "final_loss", "load_log", "recompiles_after_first_log", "plan",
    "plan_error", "peer", "ratio_vs_peer", "one", "two", "max_loss_diff", "max_grad_norm_rel_diff", "target", "met",
    "error", *checks.PREDICTION, "provenance", "gradient_checkpointing", "checkpoint_layers"}
OTHER_KEYS = {
    "ceilings": {"gpu", "copy_gbs", "square_bf16_tflops", "shape", "tokens", "steps", "loss_fwd_bwd_ms", "provenance"},
    "mlp": {"device", "shape", "tokens", "rows", "provenance"},
    "fp8layer": {"device", "shape", "tokens", "rows", "provenance"},  # bench/kernels/gpu_fp8_layer.py --json
    "fp8gemms": {"device", "shape", "tokens", "groups", "provenance"},  # bench/kernels/gpu_fp8_gemms.py --json
    "attention": {"device", "shape", "tokens", "docs", "rows", "provenance"},
    "strategies": {"environment", "args", "results", "provenance"},
    "gemm": {"gpu", "tokens", "shapes", "gemms", "provenance"},  # bench/kernels/gpu_gemm_tune.py --json
    "profile": {"path", "profile_steps", "total_ms", "by_kind", "launched_by", "gpu", "shape", "budget", "docs",
                "attention", "kernels", "provenance"},  # bench/suites/gpu_single.py --profile
    "cli": {"machine", "runs", "python_start_s", "rows", "provenance"},  # bench/suites/cli_latency.py: CPU only
    "tokenize": {"rows", "cores", "qa_rows", "workers", "examples", "tokens", "tokenize_s", "rows_per_s",
                 "peak_rss_main_gib", "peak_rss_worker_gib", "restart_s", "cache_hits", "data_written_s", "chats_mib",
                 "provenance"},  # bench/suites/data_tokenize.py: CPU work, wherever it ran
    "longctx": {"shape", "arch", "seq_len", "context_parallel", "gpu_count", "gpu", "peak_flops", "lora_r",
                "lora_targets", "lora_params", "variant", "tokens", "planned_gib", "settings", "step", "tokens_per_s",
                "tflops_per_gpu", "mfu", "peak_mem_gib", "peak_reserved_gib", "step_records", "error",
                "warmup_steps", "timed_steps", "real_tokens", "seconds",
                *checks.PREDICTION, "provenance"},  # bench/suites/gpu_long_context.py (LoRA, one GPU); full: LONGCTX_FULL_KEYS
    # bench/multi/gpu_multi.py's phases, multi_full.py (8b-peer, --repeat: distribution's fields), multi_fp8.py,
    # gpu_multi_lora.py: their blocks checked in test_results_kinds.py. No `difference_reason`: no multi bench writes one.
    "multi": {"gpu_count", "docs", "max_doc_tokens", "disk_write_gbps", "checkpoint_write_s", "naive_load", "8b", "8b_exit",
              "8b_load", "8b_log_tail", "8b_model_ready_s", "8b_peak_rss_mib", "8b_restore_s", "8b_resume_log_tail",
              "8b_resume_model_ready_s", "8b_resume_total_s", "8b_save", "8b_mfu_run", "scaling_1b", "save_1b",
              "weak_scaling_efficiency", "fp8_8b", "fp8_8b_bf16_error", "fp8_8b_fp8_error", "fp8_8b_auto_error",
              "8b_full", "8b_full_peer", "8b_full_error", "8b_full_peer_error", "8b_full_windows_before_error",
              "8b_full_peer_windows_before_error", "8b_lora", "8b_lora_peer", "8b_lora_error", "8b_lora_peer_error",
              "budget", "expected_save_gb", "expected_save_s", "max_steps", "mean_step_mfu", "mfu", "peer",
              "ratio_vs_peer", "shape", "steps", "tokens_per_gpu", *DISTRIBUTION_KEYS, "provenance"},
    # bench/suites/gpu_single.py --repeat N (check_compare_record); difference_reason: its FastChat-style peer only
    "compare": {"shape", "budget", "docs", "total_real_tokens", "gpu", "gpu_count", "peak_flops", "difference_reason",
                *DISTRIBUTION_KEYS, "provenance"},
    "qlora": QLORA_KEYS,  # bench/multi/gpu_qlora.py: checked in test_results_kinds.py
    "lora": QLORA_KEYS,  # bench/multi/gpu_qlora.py llama70b --lora-bf16 (lora-bf16-llama70b-*.json): as qlora's 70B run
    "resume": {"arch", "gpu_count", "seed", "steps", "tokens", "results", "provenance"},  # bench/multi/gpu_resume.py
    "save": {"arch", "gpu_count", "steps", "save_every", "tokens_per_micro_batch", "gradient_accumulation_steps", "docs",
             "max_doc_tokens", "staging",
             "disk_write_gbps", "state_gb", "nosave", "async", "resume_exit", "resume_s", "resume_restore_s", "sync",
             "resume_phases", "provenance"},  # bench/multi/gpu_save_async.py's save-async.json: checked below (save_async_problems)
    "moelora": {"shape", "arch", "budget", "steps", "docs", "total_real_tokens", "gpu", "gpu_count", "peak_flops",
                "lora_r", "lora_targets", "layer", "order", "sides", "runs_per_side", "ratio_median", "ratio_min",
                "ratio_max", "peer_low_runs", "gpt_oss", "provenance"},  # bench/suites/gpu_moe_lora.py
    "parity": {"shape", "steps", "budget", "lr", "warmup_ratio", "train_docs", "eval_docs", "gpu", "sides", "comparisons",
               "provenance", "merged_from"},  # bench/suites/gpu_parity.py (merged_from: --merge)
}
# bench/multi/gpu_context_parallel.py: longctx-<shape>-full-<seq_len>-cp<N>.json (8B full fine-tune, CP over N GPUs)
LONGCTX_FULL_KEYS = {
    "shape", "arch", "fine_tune", "seq_len", "context_parallel", "gpu_count", "gpu", "peak_flops", "budget_s",
    "target_mfu", "peer_unavailable", "published_peer", "max_steps", "wall_s", "gradient_checkpointing", "compile",
    "kernels", "recompiles", "activation_offload", "plan", "error", "windows", "real_tokens", "seconds", "warmup_steps",
    "real_tokens_per_s", "peak_mem_gib", "steps", "final_loss", "recompiles_after_first_log", "flops_per_token",
    "tflops_per_gpu", "mfu", "mean_step_mfu", "tokens_per_s_per_gpu", *checks.PREDICTION, "provenance"}


_id, _load = checks.result_id, checks.load  # results_checks' helpers, as the tests below name them


def _kind(path: Path) -> str | None:
    prefix = path.name.split("-")[0]
    return prefix if prefix in {"single", *OTHER_KEYS} else None


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_provenance(path):
    data, name = _load(path), _id(path)
    provenance = data.get("provenance")
    assert provenance, f"{name}: no provenance block (write results through bench/results_io.write_result)"
    assert set(PROVENANCE_KEYS) <= provenance.keys(), f"{name}: provenance lacks {set(PROVENANCE_KEYS) - provenance.keys()}"
    # 40 hex digits, or an abbreviation of at least 7 as a lent GPU machine's $BENCH_COMMIT declared it (the tree is
    # copied there without .git): test_results_history resolves either to a commit in main's history
    assert re.fullmatch(r"[0-9a-f]{7,40}", provenance["commit"]), f"{name}: no git commit"
    assert provenance["command"] and provenance["date_utc"], f"{name}: no command or date"
    assert provenance["gpu_count"] == len(provenance["gpus"]), f"{name}: gpu_count is not the GPUs' count"
    if _kind(path) == "cli":  # a CPU benchmark: the machine it ran on instead of a GPU
        assert provenance["gpu_count"] == 0 and data["machine"]["gpu"] == "none" and data["machine"]["cpu"], name
    elif _kind(path) == "tokenize":  # CPU work: the cores it had, a GPU or not
        assert data["cores"] >= data["workers"] >= 1, name
    elif "merged_from" in data:  # bench/suites/gpu_parity.py --merge, which may run anywhere: its runs' GPUs
        for source in data["merged_from"]:
            runs = source["provenance"]
            assert set(PROVENANCE_KEYS) <= runs.keys() and runs["gpu_count"] > 0, f"{name}: {source['file']}: no GPU"
    else:
        assert provenance["gpu_count"] > 0, f"{name}: no GPU recorded"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_known_fields_only(path):
    data, kind = _load(path), _kind(path)
    assert kind, f"{_id(path)}: no bench script writes a file named like this"
    allowed = SINGLE_KEYS if kind == "single" else OTHER_KEYS[kind]
    if kind == "longctx" and data.get("fine_tune") == "full":
        allowed = LONGCTX_FULL_KEYS
    extra = set(data) - allowed
    assert not extra, f"{_id(path)}: fields no bench script writes: {sorted(extra)} (edited by hand?)"


def _peak_blocks(node: object, where: str = "") -> list[tuple[str, dict]]:
    """Every block that records `peak_flops` (a published peer's figure is that peer's GPU's, not ours)."""
    found = []
    if isinstance(node, dict):
        if "peak_flops" in node:
            found.append((where, node))
        for key, value in node.items():
            if key != "published_peer":
                found += _peak_blocks(value, f"{where}.{key}".lstrip("."))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _peak_blocks(value, f"{where}[{index}]")
    return found


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_peak_flops_is_the_gpu_names(path):
    """Issue #61: the peak comes from the GPU's name (contract/gpus.py), never typed; a `gpu` field names a GPU the
    provenance saw."""
    from contract.gpus import gpu_type_from_device_name, lookup

    data, name = _load(path), _id(path)
    seen = data["provenance"]["gpus"]
    for where, block in _peak_blocks(data):
        gpu = block.get("gpu") or data.get("gpu") or data.get("device") or (seen[0] if seen else None)
        if gpu is None:  # a CPU run: no peak
            assert block["peak_flops"] is None, f"{name}: {where}: a peak without a GPU"
            continue
        assert not seen or gpu in seen, f"{name}: {where}: gpu {gpu!r}, the provenance saw {seen}"
        spec = lookup(gpu_type_from_device_name(gpu) or "")
        expected = spec.peak_tflops_bf16 * 1e12 if spec else None
        assert block["peak_flops"] == expected, f"{name}: {where}: peak_flops {block['peak_flops']}, {gpu}'s is {expected}"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_speed_error_rederives(path):
    """speed_error = predicted / measured - 1 wherever a run records the plan's prediction (issue #55)."""
    problems = checks.speed_problems(_load(path), _id(path))
    assert not problems, problems


# What write_result records (its provenance names the GPUs) on a committed file of each kind of run, tampered in memory.
PREDICTED = {"h200/longctx-2026-11-29/longctx-llama3-8b-lora-262144-offload-mlp-chunks.json": ("",),
             "h100/four-gpu-2026-11-27d/multi-4gpu-fp8.json": ("fp8_8b", "fp8"),
             "h200/compare-2026-11-29/compare-llama3.2-1b-ours-vs-peer-trl.json": ("sides", "ours"),
             "h100/four-gpu-2026-11-26/lora-bf16-llama70b-4gpu.json": ("",)}


@pytest.mark.parametrize("name", PREDICTED)
@pytest.mark.parametrize("tamper", [None, "a speed_error", "a prediction", "one field dropped", "on a block of no run"])
def test_a_recorded_prediction_edited_by_hand_is_caught(name, tamper):
    r = with_predictions(name, _load(RESULTS / name))
    block = r
    for key in filter(None, PREDICTED[name]):
        block = block[key]
    assert block["predicted_tokens_per_s_per_gpu"] > 0 and abs(block["speed_error"]) < 0.2, name
    if tamper == "a speed_error":
        block["speed_error"] += 0.01
    elif tamper == "a prediction":
        block["predicted_tokens_per_s_per_gpu"] *= 1.01
    elif tamper == "one field dropped":
        del block["speed_error"]
    elif tamper == "on a block of no run":
        r["provenance"].update({key: block.pop(key) for key in checks.PREDICTION})
    assert bool(checks.speed_problems(r, name)) == (tamper is not None), tamper


def test_write_result_records_the_plans_prediction_in_the_runs_block(monkeypatch, tmp_path):
    """On a GPU (its name is the one thing faked here) write_result records the plan's prediction; provenance last."""
    from bench.report import results_io

    name = next(iter(PREDICTED))
    record = {key: value for key, value in _load(RESULTS / name).items() if key != "provenance"}
    monkeypatch.setattr(results_io, "_gpus", lambda: (["NVIDIA H200"], "580.159.04"))
    written = _load(results_io.write_result(tmp_path / Path(name).name, record))
    assert list(written)[-1] == "provenance" and not checks.speed_problems(written, name)
    assert written["predicted_tokens_per_s_per_gpu"] == pytest.approx(record["tokens_per_s"], rel=TOLERANCE)


def test_provenance_takes_the_declared_commit_over_a_lagging_git(monkeypatch):
    """A lent GPU machine's copy of the tree carried a .git at an older HEAD: the files ran are the
    commit the caller names in $BENCH_COMMIT, and dirtiness against the stale HEAD means nothing."""
    from bench.report.results_io import provenance

    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    head = provenance()["commit"]
    monkeypatch.setenv("BENCH_COMMIT", "0" * 40)
    declared = provenance()
    assert declared["commit"] == "0" * 40 and declared["dirty"] is None and head != "0" * 40
    monkeypatch.setenv("BENCH_COMMIT", head)
    assert provenance()["commit"] == head


def test_the_8b_stall_at_step_43_is_the_first_pack_whose_longest_document_fits_one_fa4_tile():
    """BENCHMARKS.md's 8B stall hunt: the step that stalled (43, in both runs of 1987a54) is the first of the run
    where one rank's pack (rank 1's: 104 documents, the longest 96 tokens) has no segment longer than one
    128-token FA4 tile, which made FA4 compile its single-tile backward mid-run. The pack of step 46 is the only
    other one, and found the variant compiled. Derived from the benchmark's own documents and packing plan."""
    from bench.multi import host
    from contract.config import TrainConfig
    from train.dataset.packing import collate_packed, plan_micro_batches

    lengths = sample_lengths(host.DOCS, seed=0, hi=host.MAX_DOC_TOKENS)
    plan = plan_micro_batches(lengths, 8192, TrainConfig().train.seed, epoch=0)
    one_tile = []
    for index, pack in enumerate(plan[:46 * 4]):  # rank r takes micro-batches r, r + 4, ...
        row = collate_packed([{"input_ids": [1] * lengths[i], "labels": [1] * lengths[i]} for i in pack], pad_to=8192)
        if row["max_length_q"] <= 128:
            one_tile.append((index // 4 + 1, index % 4, len(pack), row["max_length_q"]))
    assert one_tile == [(43, 1, 104, 96), (46, 1, 78, 114)]


# --------------------------------------------------------------------------- issue #51: consistency, distributions

CONSISTENT = [p for p in FILES if _kind(p) in ("single", "multi", "compare")]
FULL = "h100/four-gpu-2026-11-27d/multi-4gpu-8b-full.json"  # ours and TRL's FSDP2 peer at 8B, one call
SINGLE_PAIR = ("h100/single-2026-11-26/single-llama3.2-1b-ours.json", "h100/single-2026-11-26/single-llama3.2-1b-peer-trl.json")


def _problems(r: dict, name: str, folder: Path) -> list[str]:
    kind = name.split("/")[-1].split("-")[0]
    if kind == "multi":
        return checks.multi_problems(r, name)
    if kind == "compare":
        return checks.compare_problems(r, name)
    peer = _load(folder / f"single-{r['shape']}-{r['peer']}.json") if "peer" in r else None
    return checks.single_problems(r, name, peer)


@pytest.mark.parametrize("path", CONSISTENT, ids=_id)
def test_windows_token_slots_sides_and_mfu_means_agree(path):
    """Timed windows sum to the totals; real tokens fit the steps' token slots; the sides of a comparison timed the
    same steps, tokens per step and activation checkpointing (or say why); MFU means cover the timed windows."""
    problems = _problems(_load(path), _id(path), path.parent)
    assert not problems, f"{_id(path)}:\n" + "\n".join(problems)


def test_the_allowed_differences_are_real_and_said():
    """Every entry of results_checks.ALLOWED names a committed file and a problem the check finds there."""
    for (name, check), reason in checks.ALLOWED.items():
        assert (RESULTS / name).is_file() and len(reason) > 40, name
        saved = dict(checks.ALLOWED)
        try:
            checks.ALLOWED.clear()
            found = _problems(_load(RESULTS / name), name, (RESULTS / name).parent)
        finally:
            checks.ALLOWED.update(saved)
        assert any(line.startswith(check + ":") for line in found), f"{name}: nothing for {check} to allow"


def _full() -> dict:
    r = _load(RESULTS / FULL)
    assert not checks.multi_problems(r, FULL)
    return copy.deepcopy(r)


def test_a_window_edited_by_hand_is_caught():
    r = _full()
    timed = [w for w in r["8b_full"]["windows"] if w["step"] > clock_start(w["step"] for w in r["8b_full"]["windows"])]
    timed[3]["tokens_per_s"] *= 1.01
    assert any(p.startswith("windows:") and "real tokens" in p for p in checks.multi_problems(r, FULL))
    r = _full()
    r["8b_full"]["windows"][-1]["seconds"] += 0.5
    assert any(p.startswith("windows:") and "seconds" in p for p in checks.multi_problems(r, FULL))


def test_more_real_tokens_than_token_slots_is_caught():
    r = _full()
    ours = r["8b_full"]
    ours["real_tokens"] = ours["steps"] * ours["tokens_per_micro_batch"] * ours["gpu_count"] + 1
    assert any(p.startswith("token slots:") for p in checks.multi_problems(r, FULL))
    single, peer = (_load(RESULTS / name) for name in SINGLE_PAIR)
    assert not checks.single_problems(single, SINGLE_PAIR[0], peer)
    single["real_tokens"] = single["steps"] * single["budget"] + 1
    assert any(p.startswith("token slots:") for p in checks.single_problems(single, SINGLE_PAIR[0], peer))


@pytest.mark.parametrize("tamper", ["peer ran fewer steps", "peer checkpointed activations", "ours had more tokens a step"])
def test_sides_that_differ_without_a_reason_are_caught(tamper):
    r = _full()
    if tamper == "peer ran fewer steps":
        r["8b_full_peer"]["steps"] -= 1
    elif tamper == "peer checkpointed activations":
        r["8b_full_peer"]["gradient_checkpointing"] = True
    else:
        r["8b_full"]["tokens_per_micro_batch"] *= 2
    assert any(p.startswith("comparison:") for p in checks.multi_problems(r, FULL))
    r["difference_reason"] = "recorded by the bench when it made the sides differ on purpose"
    assert not any(p.startswith("comparison:") for p in checks.multi_problems(r, FULL))
    single, peer = (_load(RESULTS / name) for name in SINGLE_PAIR)
    peer["path"] = "peer-trl-ckpt"  # a TRL peer with activation checkpointing against ours without
    assert any(p.startswith("comparison:") for p in checks.single_problems(single, SINGLE_PAIR[0], peer))


def test_an_mfu_mean_over_other_windows_is_caught():
    r = _full()
    ours = r["8b_full"]
    ours["mean_step_mfu"] = statistics.fmean(w["mfu"] for w in ours["windows"])  # the warm-up's windows too
    assert any(p.startswith("mfu mean:") for p in checks.multi_problems(r, FULL))


# bench/multi/gpu_save_async.py's output from its CPU smoke (BENCH_CPU_SMOKE=1), unedited: the sample the checks of
# save-async.json are shown failing on, tampered in memory (no peak FLOP/s on a CPU: the test gives it one).
SAVE_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "save-async-cpu-smoke.json"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "save"], ids=_id)
def test_save_async_numbers_rederive(path):
    r, name = _load(path), _id(path)
    assert path.name == "save-async.json", f"{name}: not the name gpu_save_async.py gives it"
    problems = checks.save_async_problems(r, name)
    assert not problems, f"{name}:\n" + "\n".join(problems)


def _save_sample(peak_flops: float | None = None) -> dict:
    """The smoke's file; with `peak_flops`, as a GPU of that peak would have recorded the same runs."""
    r = _load(SAVE_SAMPLE)
    for run in checks.SAVE_RUNS:
        block = r[run]
        block["peak_flops"] = peak_flops
        block["mfu"] = block["tflops_per_gpu"] * 1e12 / peak_flops if peak_flops else None
        paused = block["save_pause_total_s"]
        block["mfu_with_pauses"] = (block["mfu"] * block["seconds"] / (block["seconds"] + paused)
                                    if peak_flops else None)
    return r


def test_a_save_async_file_records_the_plans_prediction_of_each_training_run():
    """save-async.json's nosave, async and sync runs are plans the planner expresses (issue #64 item 4): each records
    the prediction and speed_error in its block (the CPU sample as an H100 would have written it); a tampered one
    is caught."""
    sample = _save_sample(peak_flops=989e12)
    sample["provenance"]["gpus"] = ["NVIDIA H100 80GB HBM3"]
    r = with_predictions(SAVE_SAMPLE.name, sample)
    assert all(r[run]["predicted_tokens_per_s_per_gpu"] > 0 for run in checks.SAVE_RUNS)
    assert not checks.speed_problems(r, SAVE_SAMPLE.name)
    r["async"]["speed_error"] += 0.01
    assert checks.speed_problems(r, SAVE_SAMPLE.name)


@pytest.mark.parametrize("tamper", ["a pause", "a write rate", "a pause total", "mfu with pauses above mfu",
                                    "a resume without time", "a synchronous save in the async run", "a rate",
                                    "resume phases longer than the resume"])
def test_a_save_async_file_edited_by_hand_is_caught(tamper):
    assert not checks.save_async_problems(_save_sample(), SAVE_SAMPLE.name)
    r = _save_sample(peak_flops=1e12)
    assert not checks.save_async_problems(r, SAVE_SAMPLE.name)
    if tamper == "a pause":
        r["async"]["save_pause_s"][0] /= 10
    elif tamper == "a write rate":
        r["sync"]["write_gbps"][-1] *= 2
    elif tamper == "a pause total":
        r["sync"]["save_pause_total_s"] += 1.0
    elif tamper == "mfu with pauses above mfu":
        r["async"]["mfu_with_pauses"] = r["async"]["mfu"] * 1.05
    elif tamper == "a resume without time":
        r["resume_s"] = 0.0
    elif tamper == "resume phases longer than the resume":
        r["resume_phases"]["checkpoint_load"] += r["resume_s"]
    elif tamper == "a synchronous save in the async run":
        r["async"]["saves"][0]["mode"] = "sync"
    else:
        r["nosave"]["real_tokens_per_s"] *= 1.1
    assert checks.save_async_problems(r, SAVE_SAMPLE.name), tamper


# bench/multi/gpu_context_parallel.py --cpu-smoke's 512-token file, unedited: the sample the checks of a CP results
# file are shown failing on, tampered in memory (a CPU has no peak FLOP/s: _longctx_sample gives it one).
LONGCTX_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "longctx-cp-cpu-smoke.json"
LONGCTX_NAME = "longctx-tiny-full-512-cp2.json"


def _longctx_sample(peak_flops: float) -> dict:
    """The smoke's file as a GPU of `peak_flops` would have recorded the same run, with a published peer figure."""
    from bench.multi.gpu_context_parallel import TORCHTITAN

    r = _load(LONGCTX_SAMPLE)
    r["peak_flops"] = peak_flops
    r["mfu"] = r["tflops_per_gpu"] * 1e12 / peak_flops
    for window in r["windows"]:
        window["mfu"] = window["tokens_per_s"] / r["gpu_count"] * r["flops_per_token"] / peak_flops
    _, timed = checks._timed(r["windows"])
    r["mean_step_mfu"] = statistics.fmean(w["mfu"] for w in timed)
    r["published_peer"] = {"name": TORCHTITAN["name"], "gpus": 8, "tokens_per_s_per_gpu": 3890, "peak_flops": peak_flops}
    r["published_peer"]["mfu"] = throughput_numbers(r["arch"], [r["seq_len"]], 3890 * 8, 8, peak_flops)["mfu"]
    return r


@pytest.mark.parametrize("tamper", ["a rate", "an mfu", "a window", "an mfu mean", "more tokens than documents",
                                    "the published figure", "the target", "renamed"])
def test_a_context_parallel_file_edited_by_hand_is_caught(tamper):
    assert not checks.longctx_full_problems(_load(LONGCTX_SAMPLE), LONGCTX_NAME)
    r = _longctx_sample(1e12)
    assert not checks.longctx_full_problems(r, LONGCTX_NAME)
    name = LONGCTX_NAME
    if tamper == "a rate":
        r["real_tokens_per_s"] *= 1.05
    elif tamper == "an mfu":
        r["mfu"] *= 1.05
    elif tamper == "a window":
        r["windows"][-1]["seconds"] += 0.01
    elif tamper == "an mfu mean":
        r["mean_step_mfu"] = statistics.fmean(w["mfu"] for w in r["windows"])  # the warm-up's windows too
    elif tamper == "more tokens than documents":
        r["real_tokens"] = r["steps"] * r["seq_len"] + 1
    elif tamper == "the published figure":
        r["published_peer"]["tokens_per_s_per_gpu"] = 4200
    elif tamper == "the target":
        r["target_mfu"] = 0.30
    else:
        name = "longctx-tiny-full-1024-cp2.json"
    problems = checks.longctx_full_problems(r, name)
    assert problems, tamper
    if tamper == "more tokens than documents":  # the slot check itself, not only the rate it also breaks
        assert any("steps x" in line for line in problems), problems


def test_a_typed_difference_reason_or_a_renamed_gpu_is_caught():
    """Issue #61's tamperings, in memory: a `difference_reason` no multi bench writes (it switches the side check
    off), and a GPU renamed to a slower one with that one's peak (the provenance saw another)."""
    from contract.gpus import GPUS

    path = RESULTS / FULL
    data = _load(path)
    assert "difference_reason" not in OTHER_KEYS["multi"] and not set(data) - OTHER_KEYS["multi"]
    for block in (data["8b_full"], data["8b_full_peer"]):
        block["gpu"], block["peak_flops"] = "NVIDIA H100 PCIe", GPUS["h100-pcie"].peak_tflops_bf16 * 1e12
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checks, "load", lambda _: data)
        patch.setitem(globals(), "_load", lambda _: data)
        with pytest.raises(AssertionError, match="the provenance saw"):
            test_peak_flops_is_the_gpu_names(path)
        data["8b_full"]["gpu"] = data["8b_full_peer"]["gpu"] = "NVIDIA H100 80GB HBM3"
        with pytest.raises(AssertionError, match="peak_flops"):
            test_peak_flops_is_the_gpu_names(path)
