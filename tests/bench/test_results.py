"""Every committed file under bench/results is a bench script's output, unedited: its derived numbers
(MFU, TFLOP/s, ratios to the peer it names, token counts, pass verdicts) are re-derived here from its
raw fields with the project's functions (bench/report/results_io.py, contract/shape.py's FLOP count) and
must agree to rounding. Every file carries a `provenance` block (the files written before
bench/report/results_io.py existed were removed in issue #33, see BENCHMARKS.md)."""

from __future__ import annotations

import copy
import json
import re
import statistics
from pathlib import Path

import pytest

from bench.suites.gpu_single import PEERS, VARIANTS
from bench.report.results_io import PROVENANCE_KEYS, RESULTS, WARMUP_STEPS, clock_start, throughput_numbers
from bench.report.speed_inputs import with_predictions
from bench.suites.speed_calibration import TOLERANCE
from bench.common.synthetic import SHAPES, document_lengths, sample_lengths
from tests.bench import results_checks as checks

FILES = sorted(RESULTS.rglob("*.json"))

SINGLE_KEYS = {  # everything bench/suites/gpu_single.py has written, ours and peers
    "path", "real_tokens", "seconds", "warmup_steps", "real_tokens_per_s", "peak_mem_gib", "steps", "final_loss",
    "recompiles_after_first_log", "gpu", "gpu_count", "peak_flops", "shape", "budget", "total_real_tokens", "docs",
    "flops_per_token", "tflops_per_gpu", "mfu", "peer", "peer_real_tokens_per_s", "ratio_vs_peer", "provenance",
    "attention", "kernels",  # the attention backend that ran; ours: the kernel lines of its train.log
    "lora_params",  # LoRA sides: adapter parameters of the 4·N + 6·N_lora FLOP count (results_io.throughput_numbers)
    "step_seconds",  # peers: each timed step's seconds (bench/peers/peer_clock.py)
    *checks.PREDICTION,  # ours: the plan's prediction (results_io.write_result, from issue #55 on)
}
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
                *checks.PREDICTION, "provenance"},  # bench/suites/gpu_long_context.py
    "multi": None,  # checked block by block below
    "compare": None,  # bench/suites/gpu_single.py --repeat N: checked below (check_compare_record)
    "qlora": None,  # bench/multi/gpu_qlora.py: checked below
    "lora": None,  # bench/multi/gpu_qlora.py llama70b --lora-bf16 (lora-bf16-llama70b-*.json): checked as qlora's 70B run
    "resume": None,  # bench/multi/gpu_resume.py: checked below
    "save": {"arch", "gpu_count", "steps", "save_every", "tokens_per_micro_batch", "docs", "max_doc_tokens", "staging",
             "disk_write_gbps", "state_gb", "nosave", "async", "resume_exit", "resume_s", "resume_restore_s", "sync",
             "resume_phases", "provenance"},  # bench/multi/gpu_save_async.py's save-async.json: checked below (save_async_problems)
    "parity": {"shape", "steps", "budget", "lr", "warmup_ratio", "train_docs", "eval_docs", "gpu", "sides", "comparisons",
               "provenance", "merged_from"},  # bench/suites/gpu_parity.py (merged_from: --merge)
}


def _id(path: Path) -> str:
    return str(path.relative_to(RESULTS))


def _kind(path: Path) -> str | None:
    prefix = path.name.split("-")[0]
    return prefix if prefix in {"single", *OTHER_KEYS} else None


_close = checks.close


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_provenance(path):
    data, name = _load(path), _id(path)
    provenance = data.get("provenance")
    assert provenance, f"{name}: no provenance block (write results through bench/results_io.write_result)"
    assert set(PROVENANCE_KEYS) <= provenance.keys(), f"{name}: provenance lacks {set(PROVENANCE_KEYS) - provenance.keys()}"
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["commit"]), f"{name}: no git commit"
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
    if allowed is not None:
        extra = set(data) - allowed
        assert not extra, f"{_id(path)}: fields no bench script writes: {sorted(extra)} (edited by hand?)"


SINGLE = [p for p in FILES if _kind(p) == "single"]


@pytest.mark.parametrize("path", SINGLE, ids=_id)
def test_single_gpu_numbers_rederive(path):
    r, name = _load(path), _id(path)
    assert path.name == f"single-{r['shape']}-{r['path']}.json", f"{name}: not the name gpu_single.py gives it"
    assert r["path"] in VARIANTS or r["path"].removeprefix("peer-") in PEERS, f"{name}: no such variant {r['path']}"
    lengths = document_lengths(r["docs"], r["budget"])
    assert r["total_real_tokens"] == sum(lengths), f"{name}: total_real_tokens is not the documents' token count"
    _close(r["real_tokens_per_s"], r["real_tokens"] / r["seconds"], "real_tokens_per_s", name)
    assert 0 < r["real_tokens"] <= r["total_real_tokens"], f"{name}: real_tokens out of range"
    assert r["warmup_steps"] == WARMUP_STEPS and r["gpu_count"] == 1, name
    derived = throughput_numbers(SHAPES[r["shape"]], lengths, r["real_tokens_per_s"], r["gpu_count"], r["peak_flops"],
                                 r.get("lora_params"))
    for key in ("flops_per_token", "tflops_per_gpu", "mfu"):
        _close(r[key], derived[key], key, name)


@pytest.mark.parametrize("path", SINGLE, ids=_id)
def test_ratio_is_against_the_fastest_peer_file_of_the_same_call(path):
    r, name = _load(path), _id(path)
    if "ratio_vs_peer" not in r:
        assert "peer" not in r and "peer_real_tokens_per_s" not in r, name
        return
    assert "peer" in r, f"{name}: a ratio to no named peer"
    peer_path = path.parent / f"single-{r['shape']}-{r['peer']}.json"
    assert peer_path.is_file(), f"{name}: its peer's file {peer_path.name} is not beside it"
    peer = _load(peer_path)
    _close(r["peer_real_tokens_per_s"], peer["real_tokens_per_s"], f"peer_real_tokens_per_s (vs {peer_path.name})", name)
    _close(r["ratio_vs_peer"], r["real_tokens_per_s"] / peer["real_tokens_per_s"], "ratio_vs_peer", name)
    peers = [_load(p) for p in path.parent.glob(f"single-{r['shape']}-peer-*.json")]
    assert peer["real_tokens_per_s"] == max(p["real_tokens_per_s"] for p in peers), f"{name}: not the fastest peer"
    assert r["provenance"]["command"] == peer["provenance"]["command"], f"{name}: peer from another call"


_check_run_block = checks.check_run_block


def test_multi_gpu_numbers_rederive():
    for path in (p for p in FILES if _kind(p) == "multi"):
        _check_multi(_load(path), _id(path), path)


def _check_multi(r: dict, name: str, path: Path) -> None:
    assert re.fullmatch(rf"multi-{r['gpu_count']}gpu(-[\w.-]+)?\.json", path.name), f"{name}: renamed"
    lengths = sample_lengths(r["docs"], seed=0, hi=r["max_doc_tokens"])
    for key in ("8b", "8b_mfu_run"):
        if key in r:
            _check_run_block(r[key], SHAPES["llama3-8b"], lengths, f"{name}: {key}")
    if "scaling_1b" in r:
        runs = r["scaling_1b"]
        for gpus, block in runs.items():
            _check_run_block(block, SHAPES["llama3.2-1b"], lengths, f"{name}: scaling_1b[{gpus}]")
        per_gpu = {int(g): b["real_tokens_per_s"] / b["gpu_count"] for g, b in runs.items()}
        _close(r["weak_scaling_efficiency"], per_gpu[r["gpu_count"]] / per_gpu[1], "weak_scaling_efficiency", name)
    if "fp8_8b" in r:  # bench/multi/gpu_multi.py's 8b-fp8 phase: FP8 against our bf16 path in the same call
        fp8 = r["fp8_8b"]
        for key in ("bf16", "fp8"):
            _check_run_block(fp8[key], SHAPES["llama3-8b"], lengths, f"{name}: fp8_8b.{key}")
        _close(fp8["speedup"], fp8["fp8"]["real_tokens_per_s"] / fp8["bf16"]["real_tokens_per_s"], "fp8 speedup", name)
    for key in ("8b_lora", "8b_lora_peer"):  # bench/multi/gpu_multi_lora.py: both sides at 4·N + 6·N_lora
        if key in r:
            assert r[key]["lora_params"] and r[key]["gpu_count"] == r["gpu_count"], f"{name}: {key}"
            _check_run_block(r[key], SHAPES["llama3-8b"], lengths, f"{name}: {key}")
    if "8b_lora" in r and "8b_lora_peer" in r:
        ratio = r["8b_lora"]["real_tokens_per_s"] / r["8b_lora_peer"]["real_tokens_per_s"]
        _close(r["ratio_vs_peer"], ratio, "ratio_vs_peer", name)
    if "8b_full" in r or "8b_full_peer" in r:
        check_8b_full(r, SHAPES["llama3-8b"], lengths, name)
    if "runs_per_side" in r:  # multi_full.py or gpu_multi_lora.py --repeat N: every run under `sides`
        check_multi_compare(r, SHAPES["llama3-8b"], lengths, name)


def check_multi_compare(r: dict, arch: dict, lengths: list[int], name: str) -> None:
    """A multi-GPU --repeat file: each run as its one-run file's block is checked (an 8B full run of ours as
    check_8b_full checks `8b_full`; a LoRA run with its adapters), then the figure from the runs
    (results_checks.check_distribution)."""
    full = "tokens_per_gpu" in r  # bench/multi/multi_full.py; else bench/multi/gpu_multi_lora.py
    for label, side in r["sides"].items():
        for index, run in enumerate(side["runs"]):
            what = f"{name}: {label} run {index}"
            if "error" in run:
                continue
            assert run["gpu_count"] == r["gpu_count"] and (full or run["lora_params"]), what
            if full and label == "ours":
                _check_8b_full_ours(run, r, arch, lengths, what)
            else:
                _check_run_block(run, arch, lengths, what)
    checks.check_distribution(r, name)


def check_8b_full(r: dict, arch: dict, lengths: list[int], name: str) -> None:
    """bench/multi/multi_full.py (gpu_multi's 8b-peer phase): ours' aggregate over the timed windows it lists,
    the save's seconds booked on their own, the top-level fields taken from the sides."""
    if ours := r.get("8b_full"):
        _check_8b_full_ours(ours, r, arch, lengths, name)
        assert ours["steps"] == r["steps"], f"{name}: steps"
        assert (r["mfu"], r["mean_step_mfu"]) == (ours["mfu"], ours["mean_step_mfu"]), f"{name}: top-level mfu"
    if peer := r.get("8b_full_peer"):
        _check_run_block(peer, arch, lengths, f"{name}: 8b_full_peer")
        assert r["peer"] == peer["path"] and isinstance(peer["gradient_checkpointing"], bool), f"{name}: peer"
    if ours and peer:
        _close(r["ratio_vs_peer"], ours["real_tokens_per_s"] / peer["real_tokens_per_s"], "ratio_vs_peer", name)


def _check_8b_full_ours(ours: dict, r: dict, arch: dict, lengths: list[int], name: str) -> None:
    """One 8B run of ours: its rate, FLOP numbers and MFU mean from its windows, its save inside the clock."""
    _check_run_block(ours, arch, lengths, f"{name}: 8b_full")
    start = clock_start(w["step"] for w in ours["windows"])  # logging every N steps: the first window past warm-up
    timed = [w for w in ours["windows"] if w["step"] > start]
    _close(ours["seconds"], sum(w["seconds"] for w in timed), "seconds over the timed windows", name)
    assert ours["steps"] == timed[-1]["step"] - start, f"{name}: steps"
    # The per-window mean over the windows past the recorded warm-up: until 2026-11-27 that was 4 even when
    # the clock started later (the log10 file's mean holds its compile window), since then the clock's start.
    mfus = [w["mfu"] for w in ours["windows"] if w["step"] > ours["warmup_steps"] and w["mfu"]]
    _close(ours["mean_step_mfu"], statistics.fmean(mfus) if mfus else None, "mean_step_mfu", name)
    if save := ours.get("save"):
        assert start < save["step"] < r["max_steps"], f"{name}: the save is not inside the clock"
        with_save = ours["with_save"]
        _close(with_save["seconds"], ours["seconds"] + save["seconds"], "with_save seconds", name)
        _close(with_save["real_tokens_per_s"], ours["real_tokens"] / with_save["seconds"], "with_save rate", name)
        derived = throughput_numbers(arch, lengths, with_save["real_tokens_per_s"], ours["gpu_count"],
                                     ours["peak_flops"])
        _close(with_save["mfu"], derived["mfu"], "with_save mfu", name)


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "attention"], ids=_id)
def test_attention_tflops_rederive(path):
    from bench.kernels.gpu_attention import packs

    r, name = _load(path), _id(path)
    arch = SHAPES[r["shape"]]
    heads, head_dim = arch["num_attention_heads"], arch["hidden_size"] // arch["num_attention_heads"]
    chosen = packs(r["tokens"], r["docs"])
    flop = sum(6 * heads * head_dim * sum(n * n for n in pack) for pack in chosen) / len(chosen)
    for row in r["rows"]:
        if "ms" in row:
            _close(row["tflops"], flop / row["ms"] / 1e9, f"{row['kernel']} tflops", name)


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "fp8gemms"], ids=_id)
def test_fp8_gemm_groups_rederive(path):
    from bench.kernels.gpu_fp8_gemms import groups

    r, name = _load(path), _id(path)
    arch = SHAPES[r["shape"]]
    assert {group: row["widths"] for group, row in r["groups"].items()} == groups(arch), f"{name}: widths"
    for group, row in r["groups"].items():
        flop = 6 * r["tokens"] * sum(row["widths"]) * arch["hidden_size"]
        for way in ("separate", "stacked"):
            _close(row[f"{way}_tflops"], flop / row[f"{way}_ms"] / 1e9, f"{group} {way} tflops", name)


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "strategies"], ids=_id)
def test_strategy_verdicts_rederive(path):
    r, name = _load(path), _id(path)
    for row in r["results"]:
        case = f"{name}: {row['case']}"
        if row["loss_first"] is not None:
            assert row["trains"] == (row["loss_last"] < row["loss_first"]), f"{case}: trains"
        if row["resume_bitwise"] is not None and row["resume_max_abs_diff"] is not None:
            assert row["resume_bitwise"] == (row["resume_max_abs_diff"] == 0), f"{case}: resume_bitwise"
        passed = not row["error"] and bool(row["trains"]) and bool(row["resume_bitwise"]) and bool(row["export_loads"])
        assert row["passed"] == passed, f"{case}: passed"


QLORA = [p for p in FILES if _kind(p) in ("qlora", "lora")]


def _check_raw_counts(block: dict, name: str) -> None:
    _close(block["real_tokens_per_s"], block["real_tokens"] / block["seconds"], "real_tokens_per_s", name)
    assert block["warmup_steps"] >= WARMUP_STEPS and block["real_tokens"] > 0, f"{name}: warm-up or tokens"


@pytest.mark.parametrize("path", QLORA, ids=_id)
def test_qlora_numbers_rederive(path):
    r, name = _load(path), _id(path)
    assert path.name == f"{r['path']}.json", f"{name}: not the name gpu_qlora.py gives it"
    if "error" in r or "error" in r.get("one", {}) or "error" in r.get("two", {}):
        return  # a failed run is recorded as such; no numbers to check
    if "plan" in r:  # the llama-70b run: throughput at 4·N + 6·N_lora, peak against the plan recorded then
        _check_raw_counts(r, name)
        assert max(int(s) for s in r["losses"]) >= 20, f"{name}: fewer than 20 steps"
        derived = throughput_numbers(r["arch"], document_lengths(r["docs"], r["budget"]), r["real_tokens_per_s"],
                                     r["gpu_count"], r["peak_flops"], r["lora_params"])
        for key in ("flops_per_token", "tflops_per_gpu", "mfu"):
            _close(r[key], derived[key], key, name)
        planned = r["plan"]["allocated_gib"]
        _close(r["plan_error"], (planned - r["peak_mem_gib"]) / r["peak_mem_gib"], "plan_error", name)
        return
    for side in ("one", "two"):
        _check_raw_counts(r[side], f"{name}: {side}")
    one, two = r["one"]["losses"], r["two"]["losses"]
    assert one.keys() == two.keys() and len(one) >= 20, f"{name}: the runs logged different or too few steps"
    _close(r["max_loss_diff"], max(abs(one[s] - two[s]) for s in two), "max_loss_diff", name)
    assert r["met"] == (r["max_loss_diff"] <= r["target"]), f"{name}: met"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "resume"], ids=_id)
def test_resume_verdicts_rederive(path):
    r, name = _load(path), _id(path)
    assert path.name == f"resume-{r['gpu_count']}gpu.json", f"{name}: renamed"
    for row in r["results"]:
        case = f"{name}: {row['case']}"
        assert row["gpu_count"] == r["gpu_count"] and 3 <= row["sigterm_after_step"] <= r["steps"] - 4, case
        if row["bitwise"] is not None:
            assert row["bitwise"] == (row["max_abs_diff"] == 0), f"{case}: bitwise"
            stopped = int(row["stop_checkpoint"].removeprefix("step-"))
            assert row["sigterm_after_step"] <= stopped < r["steps"], f"{case}: the stop checkpoint's step"
        else:
            assert row["error"], f"{case}: no verdict and no error"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "profile"], ids=_id)
def test_profile_shares_rederive(path):
    """A kernel profile's total is the sum of its kinds, and it sits beside the throughput file of the
    same run (same call: same command)."""
    r, name = _load(path), _id(path)
    _close(r["total_ms"], sum(r["by_kind"].values()), "total_ms", name)
    single = path.parent / f"single-{r['shape']}-{r['path']}.json"
    assert single.is_file(), f"{name}: no {single.name} beside it"
    assert _load(single)["provenance"]["command"] == r["provenance"]["command"], f"{name}: from another call"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "tokenize"], ids=_id)
def test_tokenize_numbers_rederive(path):
    r, name = _load(path), _id(path)
    assert path.name == f"tokenize-{r['rows']}.json", f"{name}: renamed"
    _close(r["rows_per_s"], r["examples"] / r["tokenize_s"], "rows_per_s", name)
    assert r["examples"] <= r["rows"] + r["qa_rows"], f"{name}: more examples than rows"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "longctx"], ids=_id)
def test_long_context_numbers_rederive(path):
    """One document of seq_len tokens a micro-batch: s̄ = seq_len; the last step's rate, LoRA's FLOP count."""
    r, name = _load(path), _id(path)
    assert path.name == f"longctx-{r['shape']}-lora-{r['seq_len']}-{r['variant']}.json", f"{name}: renamed"
    if "error" in r:
        return
    last = r["step_records"][-1]
    assert last["step"] == r["step"] and last["tokens_per_s"] == r["tokens_per_s"], f"{name}: not the last step"
    derived = throughput_numbers(r["arch"], [r["seq_len"]], r["tokens_per_s"], 1, r["peak_flops"], r["lora_params"])
    for key in ("tflops_per_gpu", "mfu"):
        _close(r[key], derived[key], key, name)


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_speed_error_rederives(path):
    """speed_error = predicted / measured - 1 wherever a run records the plan's prediction (issue #55)."""
    r, name = _load(path), _id(path)
    assert not checks.speed_problems(r, name), checks.speed_problems(r, name)


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


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "cli"], ids=_id)
def test_cli_latency_verdicts_rederive(path):
    from bench.suites.cli_latency import TARGETS_S

    r, name = _load(path), _id(path)
    assert len(r["python_start_s"]) == r["runs"], name
    for row in r["rows"]:
        assert len(row["times_s"]) == r["runs"], f"{name}: {row['command']}"
        _close(row["median_s"], statistics.median(row["times_s"]), f"{row['command']} median_s", name)
        assert row["target_s"] == TARGETS_S[row["command"]], f"{name}: {row['command']} target"
        assert row["met"] == (row["median_s"] <= row["target_s"]), f"{name}: {row['command']} met"


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "parity"], ids=_id)
def test_parity_verdicts_rederive(path):
    check_parity_record(_load(path), _id(path))


def check_parity_record(data: dict, name: str) -> None:
    """bench/suites/gpu_parity.py: every run's throughput from its raw tokens and seconds; a side of several runs
    (--repeat, --merge): its mean eval loss, each repeat's and its mean rate from its runs; every eval-loss
    ratio, 1% verdict, speed ratio and (with repeats) count and spread from the sides' own numbers."""
    from bench.report.parity_record import comparisons, runs_of, side_entry

    for side, result in data["sides"].items():
        for run in runs_of(result):
            assert len(run.get("losses", [])) == data["steps"] or "error" in run, f"{name}: {side} losses"
            if run.get("seconds"):
                _close(run["real_tokens_per_s"], run["real_tokens"] / run["seconds"], f"{side} tokens/s", name)
        if "runs" in result:
            runs = result["runs"]
            assert len(runs) > 1 and len({(r.get("file"), r["run"]) for r in runs}) == len(runs), f"{name}: {side} runs"
            derived = side_entry(runs)
            assert derived.keys() == result.keys(), f"{name}: {side} keys"
            assert result.get("eval_losses") == derived.get("eval_losses"), f"{name}: {side} eval_losses"
            for key in ("eval_loss", "real_tokens_per_s"):
                _close(result.get(key), derived.get(key), f"{side} {key} (mean over its runs)", name)
    derived = {c["side"]: c for c in comparisons(data["sides"])}
    assert {c["side"] for c in data["comparisons"]} == set(derived), f"{name}: compared sides"
    for recorded in data["comparisons"]:
        again = derived[recorded["side"]]
        assert recorded.keys() == again.keys(), f"{name}: {recorded['side']} comparison keys"
        for key, value in recorded.items():
            if isinstance(value, float):
                _close(value, again[key], f"{recorded['side']} {key}", name)
            else:
                assert value == again[key], f"{name}: {recorded['side']} {key} = {value}, re-derived {again[key]}"


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


@pytest.mark.parametrize("path", [p for p in FILES if _kind(p) == "compare"], ids=_id)
def test_compare_numbers_rederive(path):
    checks.check_compare_record(_load(path), _id(path))


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
