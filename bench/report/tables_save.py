"""BENCHMARKS.md's tables of 8B on 4 GPUs with a save inside the run (bench/multi/multi_full.py's files, issue #29), part
of bench/report/tables.py's output."""

from __future__ import annotations

from collections.abc import Callable

from bench.report.table_cells import load_result, markdown_table, per_gpu_rate, percent, save_cell, timed_windows

FOUR_GPU_T10K = "h100/four-gpu-2026-11-27e"  # the fourth 4-GPU session's last call, a fresh machine
FOUR_GPU_SYNC = "h100/four-gpu-2026-11-27f"  # the fifth 4-GPU session: accumulation and the metrics interval
FOUR_GPU_SAVE = ("h100/four-gpu-2026-11-27g", "h100/four-gpu-2026-11-27h")  # the sixth: the save at 10,240 tokens/GPU
FOUR_GPU_GLOO = "h100/four-gpu-2026-11-27i"  # the seventh: the save's object collectives over gloo
TWO_GPU_GLOO = "h100/two-gpu-2026-11-27b"  # the same session on 2 GPUs, over NCCL and over gloo
FOUR_GPU_KEEP = "h100/four-gpu-2026-11-28"  # the eighth: the allocator's cache kept over the save, each window's slowest step
FOUR_GPU_CLIP = "h100/four-gpu-2026-11-28b"  # the ninth: the clip inside the fused AdamW's step


def _ours_set(r: dict, key: str, default: str) -> str:
    """A train.toml value our run was given on the bench's command line (--ours-set KEY=VALUE), else `default`."""
    command = r["provenance"]["command"]
    values = [arg.split("=", 1)[1] for flag, arg in zip(command, command[1:])
              if flag == "--ours-set" and arg.startswith(key + "=")]
    return values[-1] if values else default


def _window_mfus(windows: list[dict]) -> str:
    timed = [w["mfu"] for w in timed_windows(windows)]
    return f"{percent(min(timed))}–{percent(max(timed))} over {len(timed)} windows" if timed else "none timed"


def _runs(earlier: str, folder: str, tags: tuple[str, ...]) -> list[str]:
    """An earlier session's results file to compare against, then this folder's 8B runs by tag."""
    return [earlier] + [f"{folder}/multi-4gpu-8b-full-{tag}.json" for tag in tags]


def mfu_8b_4gpu_settings() -> str:
    """Ours at 8B on 4 GPUs by micro-batches per step and metrics interval (the previous session's best run first): each
    run's aggregate, or the windows a run cut by its time limit logged before (each window's own MFU)."""
    files = _runs(f"{FOUR_GPU_T10K}/multi-4gpu-8b-full-t10k.json", FOUR_GPU_SYNC,
                  ("ga2-t9216", "log4-t10240", "log10-t10240", "log10-t10240-nosave"))
    rows = []
    for path in files:
        r = load_result(path)
        ours = r.get("8b_full")
        save = "none" if "--no-save8b-full" in r["provenance"]["command"] else (
            save_cell(ours['save']) if ours else "cut during or after it")
        settings = [f"`{path}`", f"{r['tokens_per_gpu']:,}", _ours_set(r, "train.gradient_accumulation_steps", "1"),
                    _ours_set(r, "train.logging_steps", "1"), save]
        if ours:
            rows.append(settings + [str(ours["steps"]), f"{per_gpu_rate(ours):,.0f}", percent(ours["mfu"])])
        else:
            rows.append(settings + [f"none ({r['8b_full_error']})", "", _window_mfus(r["8b_full_windows_before_error"])])
    return markdown_table(["file (bench/results/…)", "tokens per micro-batch", "micro-batches per step",
                           "metrics record every (steps)", "save inside the run", "steps timed", "real tokens/s per GPU",
                           "MFU (real tokens / wall time)"], rows)


def _save_at_step(ours: dict) -> str:
    if "save" not in ours:  # a profile's run (--no-save8b-full)
        return "none"
    return f"step {ours['save']['step']}: {save_cell(ours['save'])}"


def _save_run_cells(path: str, r: dict) -> list[str]:
    """One run with the save inside (results file `path`, loaded: `r`): file, commit, each timed window's MFU with
    the allocator's retries so far (cumulative), the save, and how the run ended."""
    ours = r.get("8b_full")
    windows = ours["windows"] if ours else r["8b_full_windows_before_error"]
    cells = ", ".join(f"{w['step']}: {percent(w['mfu'])} ({w['alloc_retries']})" for w in timed_windows(windows))
    save = _save_at_step(ours) if ours else "none recorded"
    ended = f"{ours['steps']} steps timed, {percent(ours['mfu'])}" if ours else r["8b_full_error"]
    return [f"`{path}`", r["provenance"]["commit"][:7], cells, save, ended]


WINDOWS_HEADER = ["window ending at step: MFU (allocator retries so far)", "save", "end"]


def save_8b_4gpu() -> str:
    """8B at 10,240 tokens per GPU with the save inside the run, by commit."""
    files = [f"{FOUR_GPU_SAVE[0]}/multi-4gpu-8b-full-log10-t10240-{name}.json" for name in ("lastlayer", "save")] + [
        f"{FOUR_GPU_SAVE[1]}/multi-4gpu-8b-full-log10-t10240-save.json"]
    rows = [_save_run_cells(path, load_result(path)) for path in files]
    return markdown_table(["file (bench/results/…)", "commit", *WINDOWS_HEADER], rows)


def save_8b_gloo() -> str:
    """The save inside an 8B run with DCP's object collectives over NCCL (the process group as Accelerate makes it)
    and over gloo (`train.cpu_object_collectives`): 4 GPUs at 10,240 tokens per GPU, then 2 GPUs at 2,560."""
    files = [f"{FOUR_GPU_SAVE[1]}/multi-4gpu-8b-full-log10-t10240-save.json",
             f"{FOUR_GPU_GLOO}/multi-4gpu-8b-full-log10-t10240-cpuobj.json",
             *(f"{TWO_GPU_GLOO}/multi-2gpu-8b-full-2gpu-{over}obj.json" for over in ("nccl", "cpu"))]
    rows = []
    for path in files:
        r = load_result(path)
        over = "gloo" if _ours_set(r, "train.cpu_object_collectives", "false") == "true" else "NCCL"
        file, commit, *rest = _save_run_cells(path, r)
        gpus = f"{r['gpu_count']} × {path.split('/')[0].upper()}"
        rows.append([file, commit, gpus, f"{r['tokens_per_gpu']:,}", over, f"{r['disk_write_gbps']:.2f}", *rest])
    return markdown_table(["file (bench/results/…)", "commit", "GPUs", "tokens per GPU", "DCP's object collectives",
                           "disk GB/s (measured first)", *WINDOWS_HEADER], rows)


def _window_with_slowest(w: dict) -> str:
    slowest = f", slowest step {w['slowest_step']}: {w['slowest_step_s']:.2f} s" if w.get("slowest_step") else ""
    return f"{w['step']}: {percent(w['mfu'])} ({w['alloc_retries']} retries{slowest})"


def save_8b_cache_kept() -> str:
    """8B on 4 GPUs with the save inside the run, the save's object collectives over gloo: the seventh session's run
    (the allocator's cache released before the save) and this session's (kept), each window's slowest step where the
    file has it."""
    return _runs_with_slowest_step(_runs(f"{FOUR_GPU_GLOO}/multi-4gpu-8b-full-log10-t10240-cpuobj.json", FOUR_GPU_KEEP, (
        "log10-t10240-norelease", "log10-t10240-clock", "prof-after-save", "log10-t11264-norelease")))


def save_8b_clip_in_step() -> str:
    """The ninth session: the eighth's first run, the profiles at c0849e5 (the copies) and af2e548 (token-major
    attention, reverted), then the runs with the clip inside the fused AdamW's step."""
    return _runs_with_slowest_step(_runs(f"{FOUR_GPU_KEEP}/multi-4gpu-8b-full-log10-t10240-norelease.json", FOUR_GPU_CLIP, (
        "prof-copies", "prof-token-major", "log10-t10240-clip-in-step", "log10-t10240-clip-in-step-2")), mfu_digits=2)


def _runs_with_slowest_step(files: list[str], mfu_digits: int = 1) -> str:
    rows = []
    for path in files:
        r = load_result(path)
        ours = r["8b_full"]
        windows = "; ".join(_window_with_slowest(w) for w in timed_windows(ours["windows"]))
        rows.append([f"`{path}`", r["provenance"]["commit"][:7], f"{r['tokens_per_gpu']:,}", windows,
                     _save_at_step(ours), str(ours["steps"]),
                     f"{per_gpu_rate(ours):,.0f}", percent(ours["mfu"], mfu_digits)])
    return markdown_table(["file (bench/results/…)", "commit", "tokens per GPU",
                           "window ending at step: MFU (allocator retries so far, slowest step)", "save", "steps timed",
                           "real tokens/s per GPU", "MFU (real tokens / wall time)"], rows)


SAVE_TABLES: dict[str, Callable[[], str]] = {
    "mfu-8b-4gpu-settings": mfu_8b_4gpu_settings, "save-8b-4gpu": save_8b_4gpu, "save-8b-gloo": save_8b_gloo,
    "save-8b-cache-kept": save_8b_cache_kept, "save-8b-clip-in-step": save_8b_clip_in_step,
}
