"""Each kind of committed results file under bench/results, re-derived from its raw fields with the project's
functions (bench/report/results_io.py, contract/shape.py's FLOP count): single- and multi-GPU throughput, MFU
and peer ratios, kernel rows, verdicts of the strategy, resume, CLI and parity runs. What every file must have
(provenance, known fields, the plan's prediction) is tests/bench/test_results.py's."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from bench.suites.gpu_single import PEERS, VARIANTS
from bench.report.results_io import WARMUP_STEPS, clock_start, throughput_numbers
from bench.common.synthetic import SHAPES, document_lengths, sample_lengths
from tests.bench import results_checks as checks
from tests.bench.results_checks import close, load, of_kind, result_id


SINGLE = of_kind("single")


@pytest.mark.parametrize("path", SINGLE, ids=result_id)
def test_single_gpu_numbers_rederive(path):
    r, name = load(path), result_id(path)
    assert path.name == f"single-{r['shape']}-{r['path']}.json", f"{name}: not the name gpu_single.py gives it"
    assert r["path"] in VARIANTS or r["path"].removeprefix("peer-") in PEERS, f"{name}: no such variant {r['path']}"
    lengths = document_lengths(r["docs"], r["budget"])
    assert r["total_real_tokens"] == sum(lengths), f"{name}: total_real_tokens is not the documents' token count"
    close(r["real_tokens_per_s"], r["real_tokens"] / r["seconds"], "real_tokens_per_s", name)
    assert 0 < r["real_tokens"] <= r["total_real_tokens"], f"{name}: real_tokens out of range"
    assert r["warmup_steps"] == WARMUP_STEPS and r["gpu_count"] == 1, name
    derived = throughput_numbers(SHAPES[r["shape"]], lengths, r["real_tokens_per_s"], r["gpu_count"], r["peak_flops"],
                                 r.get("lora_params"))
    for key in ("flops_per_token", "tflops_per_gpu", "mfu"):
        close(r[key], derived[key], key, name)


@pytest.mark.parametrize("path", SINGLE, ids=result_id)
def test_ratio_is_against_the_fastest_peer_file_of_the_same_call(path):
    r, name = load(path), result_id(path)
    if "ratio_vs_peer" not in r:
        assert "peer" not in r and "peer_real_tokens_per_s" not in r, name
        return
    assert "peer" in r, f"{name}: a ratio to no named peer"
    peer_path = path.parent / f"single-{r['shape']}-{r['peer']}.json"
    assert peer_path.is_file(), f"{name}: its peer's file {peer_path.name} is not beside it"
    peer = load(peer_path)
    close(r["peer_real_tokens_per_s"], peer["real_tokens_per_s"], f"peer_real_tokens_per_s (vs {peer_path.name})", name)
    close(r["ratio_vs_peer"], r["real_tokens_per_s"] / peer["real_tokens_per_s"], "ratio_vs_peer", name)
    peers = [load(p) for p in path.parent.glob(f"single-{r['shape']}-peer-*.json")]
    assert peer["real_tokens_per_s"] == max(p["real_tokens_per_s"] for p in peers), f"{name}: not the fastest peer"
    assert r["provenance"]["command"] == peer["provenance"]["command"], f"{name}: peer from another call"


def test_multi_gpu_numbers_rederive():
    for path in of_kind("multi"):
        check_multi(load(path), result_id(path), path)


def check_multi(r: dict, name: str, path: Path) -> None:
    assert re.fullmatch(rf"multi-{r['gpu_count']}gpu(-[\w.-]+)?\.json", path.name), f"{name}: renamed"
    lengths = sample_lengths(r["docs"], seed=0, hi=r["max_doc_tokens"])
    for key in ("8b", "8b_mfu_run"):
        if key in r:
            checks.check_run_block(r[key], SHAPES["llama3-8b"], lengths, f"{name}: {key}")
    if "scaling_1b" in r:
        runs = r["scaling_1b"]
        for gpus, block in runs.items():
            checks.check_run_block(block, SHAPES["llama3.2-1b"], lengths, f"{name}: scaling_1b[{gpus}]")
        per_gpu = {int(g): b["real_tokens_per_s"] / b["gpu_count"] for g, b in runs.items()}
        close(r["weak_scaling_efficiency"], per_gpu[r["gpu_count"]] / per_gpu[1], "weak_scaling_efficiency", name)
    if "fp8_8b" in r:  # bench/multi/gpu_multi.py's 8b-fp8 phase: FP8 against our bf16 path in the same call
        fp8 = r["fp8_8b"]
        for key in ("bf16", "fp8"):
            checks.check_run_block(fp8[key], SHAPES["llama3-8b"], lengths, f"{name}: fp8_8b.{key}")
        close(fp8["speedup"], fp8["fp8"]["real_tokens_per_s"] / fp8["bf16"]["real_tokens_per_s"], "fp8 speedup", name)
    for key in ("8b_lora", "8b_lora_peer"):  # bench/multi/gpu_multi_lora.py: both sides at 4·N + 6·N_lora
        if key in r:
            assert r[key]["lora_params"] and r[key]["gpu_count"] == r["gpu_count"], f"{name}: {key}"
            checks.check_run_block(r[key], SHAPES["llama3-8b"], lengths, f"{name}: {key}")
    if "8b_lora" in r and "8b_lora_peer" in r:
        ratio = r["8b_lora"]["real_tokens_per_s"] / r["8b_lora_peer"]["real_tokens_per_s"]
        close(r["ratio_vs_peer"], ratio, "ratio_vs_peer", name)
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
                checks.check_run_block(run, arch, lengths, what)
    checks.check_distribution(r, name)


def check_8b_full(r: dict, arch: dict, lengths: list[int], name: str) -> None:
    """bench/multi/multi_full.py (gpu_multi's 8b-peer phase): ours' aggregate over the timed windows it lists,
    the save's seconds booked on their own, the top-level fields taken from the sides."""
    if ours := r.get("8b_full"):
        _check_8b_full_ours(ours, r, arch, lengths, name)
        assert ours["steps"] == r["steps"], f"{name}: steps"
        assert (r["mfu"], r["mean_step_mfu"]) == (ours["mfu"], ours["mean_step_mfu"]), f"{name}: top-level mfu"
    if peer := r.get("8b_full_peer"):
        checks.check_run_block(peer, arch, lengths, f"{name}: 8b_full_peer")
        assert r["peer"] == peer["path"] and isinstance(peer["gradient_checkpointing"], bool), f"{name}: peer"
    if ours and peer:
        close(r["ratio_vs_peer"], ours["real_tokens_per_s"] / peer["real_tokens_per_s"], "ratio_vs_peer", name)


def _check_8b_full_ours(ours: dict, r: dict, arch: dict, lengths: list[int], name: str) -> None:
    """One 8B run of ours: its rate, FLOP numbers and MFU mean from its windows, its save inside the clock."""
    checks.check_run_block(ours, arch, lengths, f"{name}: 8b_full")
    start = clock_start(w["step"] for w in ours["windows"])  # logging every N steps: the first window past warm-up
    timed = [w for w in ours["windows"] if w["step"] > start]
    close(ours["seconds"], sum(w["seconds"] for w in timed), "seconds over the timed windows", name)
    assert ours["steps"] == timed[-1]["step"] - start, f"{name}: steps"
    # The per-window mean over the windows past the recorded warm-up: until 2026-11-27 that was 4 even when
    # the clock started later (the log10 file's mean holds its compile window), since then the clock's start.
    mfus = [w["mfu"] for w in ours["windows"] if w["step"] > ours["warmup_steps"] and w["mfu"]]
    close(ours["mean_step_mfu"], statistics.fmean(mfus) if mfus else None, "mean_step_mfu", name)
    if save := ours.get("save"):
        assert start < save["step"] < r["max_steps"], f"{name}: the save is not inside the clock"
        with_save = ours["with_save"]
        close(with_save["seconds"], ours["seconds"] + save["seconds"], "with_save seconds", name)
        close(with_save["real_tokens_per_s"], ours["real_tokens"] / with_save["seconds"], "with_save rate", name)
        derived = throughput_numbers(arch, lengths, with_save["real_tokens_per_s"], ours["gpu_count"],
                                     ours["peak_flops"])
        close(with_save["mfu"], derived["mfu"], "with_save mfu", name)


@pytest.mark.parametrize("path", of_kind("attention"), ids=result_id)
def test_attention_tflops_rederive(path):
    from bench.kernels.gpu_attention import packs

    r, name = load(path), result_id(path)
    arch = SHAPES[r["shape"]]
    heads, head_dim = arch["num_attention_heads"], arch["hidden_size"] // arch["num_attention_heads"]
    chosen = packs(r["tokens"], r["docs"])
    flop = sum(6 * heads * head_dim * sum(n * n for n in pack) for pack in chosen) / len(chosen)
    for row in r["rows"]:
        if "ms" in row:
            close(row["tflops"], flop / row["ms"] / 1e9, f"{row['kernel']} tflops", name)


@pytest.mark.parametrize("path", of_kind("fp8gemms"), ids=result_id)
def test_fp8_gemm_groups_rederive(path):
    from bench.kernels.gpu_fp8_gemms import groups

    r, name = load(path), result_id(path)
    arch = SHAPES[r["shape"]]
    assert {group: row["widths"] for group, row in r["groups"].items()} == groups(arch), f"{name}: widths"
    for group, row in r["groups"].items():
        flop = 6 * r["tokens"] * sum(row["widths"]) * arch["hidden_size"]
        for way in ("separate", "stacked"):
            close(row[f"{way}_tflops"], flop / row[f"{way}_ms"] / 1e9, f"{group} {way} tflops", name)


@pytest.mark.parametrize("path", of_kind("strategies"), ids=result_id)
def test_strategy_verdicts_rederive(path):
    r, name = load(path), result_id(path)
    for row in r["results"]:
        case = f"{name}: {row['case']}"
        if row["loss_first"] is not None:
            assert row["trains"] == (row["loss_last"] < row["loss_first"]), f"{case}: trains"
        if row["resume_bitwise"] is not None and row["resume_max_abs_diff"] is not None:
            assert row["resume_bitwise"] == (row["resume_max_abs_diff"] == 0), f"{case}: resume_bitwise"
        passed = not row["error"] and bool(row["trains"]) and bool(row["resume_bitwise"]) and bool(row["export_loads"])
        assert row["passed"] == passed, f"{case}: passed"


QLORA = of_kind("qlora", "lora")


def _check_raw_counts(block: dict, name: str) -> None:
    close(block["real_tokens_per_s"], block["real_tokens"] / block["seconds"], "real_tokens_per_s", name)
    assert block["warmup_steps"] >= WARMUP_STEPS and block["real_tokens"] > 0, f"{name}: warm-up or tokens"


@pytest.mark.parametrize("path", QLORA, ids=result_id)
def test_qlora_numbers_rederive(path):
    r, name = load(path), result_id(path)
    assert path.name == f"{r['path']}.json", f"{name}: not the name gpu_qlora.py gives it"
    if "error" in r or "error" in r.get("one", {}) or "error" in r.get("two", {}):
        return  # a failed run is recorded as such; no numbers to check
    if "plan" in r:  # the llama-70b run: throughput at 4·N + 6·N_lora, peak against the plan recorded then
        _check_raw_counts(r, name)
        assert max(int(s) for s in r["losses"]) >= 20, f"{name}: fewer than 20 steps"
        derived = throughput_numbers(r["arch"], document_lengths(r["docs"], r["budget"]), r["real_tokens_per_s"],
                                     r["gpu_count"], r["peak_flops"], r["lora_params"])
        for key in ("flops_per_token", "tflops_per_gpu", "mfu"):
            close(r[key], derived[key], key, name)
        planned = r["plan"]["allocated_gib"]
        close(r["plan_error"], (planned - r["peak_mem_gib"]) / r["peak_mem_gib"], "plan_error", name)
        return
    for side in ("one", "two"):
        _check_raw_counts(r[side], f"{name}: {side}")
    one, two = r["one"]["losses"], r["two"]["losses"]
    assert one.keys() == two.keys() and len(one) >= 20, f"{name}: the runs logged different or too few steps"
    close(r["max_loss_diff"], max(abs(one[s] - two[s]) for s in two), "max_loss_diff", name)
    assert r["met"] == (r["max_loss_diff"] <= r["target"]), f"{name}: met"


@pytest.mark.parametrize("path", of_kind("resume"), ids=result_id)
def test_resume_verdicts_rederive(path):
    r, name = load(path), result_id(path)
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


@pytest.mark.parametrize("path", of_kind("profile"), ids=result_id)
def test_profile_shares_rederive(path):
    """A kernel profile's total is the sum of its kinds, and it sits beside the throughput file of the
    same run (same call: same command)."""
    r, name = load(path), result_id(path)
    close(r["total_ms"], sum(r["by_kind"].values()), "total_ms", name)
    single = path.parent / f"single-{r['shape']}-{r['path']}.json"
    assert single.is_file(), f"{name}: no {single.name} beside it"
    assert load(single)["provenance"]["command"] == r["provenance"]["command"], f"{name}: from another call"


@pytest.mark.parametrize("path", of_kind("tokenize"), ids=result_id)
def test_tokenize_numbers_rederive(path):
    r, name = load(path), result_id(path)
    assert path.name == f"tokenize-{r['rows']}.json", f"{name}: renamed"
    close(r["rows_per_s"], r["examples"] / r["tokenize_s"], "rows_per_s", name)
    assert r["examples"] <= r["rows"] + r["qa_rows"], f"{name}: more examples than rows"


@pytest.mark.parametrize("path", of_kind("longctx"), ids=result_id)
def test_long_context_numbers_rederive(path):
    """One document of seq_len tokens a micro-batch: s̄ = seq_len; the timed steps' rate (earlier files: the last
    step's), LoRA's FLOP count. A full
    fine-tune with context parallelism (bench/multi/gpu_context_parallel.py): results_checks.longctx_full_problems."""
    r, name = load(path), result_id(path)
    if r.get("fine_tune") == "full":
        problems = checks.longctx_full_problems(r, path.name)
        assert not problems, f"{name}:\n" + "\n".join(problems)
        return
    assert path.name == f"longctx-{r['shape']}-lora-{r['seq_len']}-{r['variant']}.json", f"{name}: renamed"
    if "error" in r:
        return
    last = r["step_records"][-1]
    if "timed_steps" in r:  # the steps after the warm-up, timed together (files from 2026-12-06 on)
        first = next(s for s in r["step_records"] if s["step"] == r["warmup_steps"])
        assert r["timed_steps"] == last["step"] - first["step"] >= 3, f"{name}: timed steps"
        assert r["real_tokens"] == r["timed_steps"] * r["seq_len"], f"{name}: real_tokens"
        close(r["seconds"], last["elapsed_s"] - first["elapsed_s"], "seconds", name)
        close(r["tokens_per_s"], r["real_tokens"] / r["seconds"], "tokens_per_s", name)
    else:  # earlier files: the last step's rate
        assert last["step"] == r["step"] and last["tokens_per_s"] == r["tokens_per_s"], f"{name}: not the last step"
    derived = throughput_numbers(r["arch"], [r["seq_len"]], r["tokens_per_s"], 1, r["peak_flops"], r["lora_params"])
    for key in ("tflops_per_gpu", "mfu"):
        close(r[key], derived[key], key, name)


@pytest.mark.parametrize("path", of_kind("cli"), ids=result_id)
def test_cli_latency_verdicts_rederive(path):
    from bench.suites.cli_latency import TARGETS_S

    r, name = load(path), result_id(path)
    assert len(r["python_start_s"]) == r["runs"], name
    for row in r["rows"]:
        assert len(row["times_s"]) == r["runs"], f"{name}: {row['command']}"
        close(row["median_s"], statistics.median(row["times_s"]), f"{row['command']} median_s", name)
        assert row["target_s"] == TARGETS_S[row["command"]], f"{name}: {row['command']} target"
        assert row["met"] == (row["median_s"] <= row["target_s"]), f"{name}: {row['command']} met"


@pytest.mark.parametrize("path", of_kind("parity"), ids=result_id)
def test_parity_verdicts_rederive(path):
    check_parity_record(load(path), result_id(path))


def check_parity_record(data: dict, name: str) -> None:
    """bench/suites/gpu_parity.py: every run's throughput from its raw tokens and seconds; a side of several runs
    (--repeat, --merge): its mean eval loss, each repeat's and its mean rate from its runs; every eval-loss
    ratio, 1% verdict, speed ratio and (with repeats) count and spread from the sides' own numbers."""
    from bench.report.parity_record import comparisons, runs_of, side_entry

    for side, result in data["sides"].items():
        for run in runs_of(result):
            assert len(run.get("losses", [])) == data["steps"] or "error" in run, f"{name}: {side} losses"
            if run.get("seconds"):
                close(run["real_tokens_per_s"], run["real_tokens"] / run["seconds"], f"{side} tokens/s", name)
        if "runs" in result:
            runs = result["runs"]
            assert len(runs) > 1 and len({(r.get("file"), r["run"]) for r in runs}) == len(runs), f"{name}: {side} runs"
            derived = side_entry(runs)
            assert derived.keys() == result.keys(), f"{name}: {side} keys"
            assert result.get("eval_losses") == derived.get("eval_losses"), f"{name}: {side} eval_losses"
            for key in ("eval_loss", "real_tokens_per_s"):
                close(result.get(key), derived.get(key), f"{side} {key} (mean over its runs)", name)
    derived = {c["side"]: c for c in comparisons(data["sides"])}
    assert {c["side"] for c in data["comparisons"]} == set(derived), f"{name}: compared sides"
    for recorded in data["comparisons"]:
        again = derived[recorded["side"]]
        assert recorded.keys() == again.keys(), f"{name}: {recorded['side']} comparison keys"
        for key, value in recorded.items():
            if isinstance(value, float):
                close(value, again[key], f"{recorded['side']} {key}", name)
            else:
                assert value == again[key], f"{name}: {recorded['side']} {key} = {value}, re-derived {again[key]}"


@pytest.mark.parametrize("path", of_kind("compare"), ids=result_id)
def test_compare_numbers_rederive(path):
    checks.check_compare_record(load(path), result_id(path))
