"""Throughput, FLOPs/MFU and the per-step records (metrics.jsonl, console, wandb, progress bar).

FLOPs per trained token are contract/shape.py's (the planner's own count, so a plan's predicted MFU
and a run's measured one share N): 6·N + 6·L·a·s̄, with s̄ the token-weighted mean *document*
length of the step (packed documents do not attend to each other). For a mixture-of-experts model N is
the active parameters (the top-k routed experts, router, shared experts, attention, lm_head), and
sliding-window layers attend at most their window.

MFU = flops_per_token · tokens_per_s_per_gpu / peak_flops_per_gpu, with the peak (dense bf16) from
``contract.gpus``, looked up from ``torch.cuda.get_device_name()`` and falling back to
``run.gpu_type``. An unknown GPU, or a CPU run, gives ``mfu = null`` (one warning, never a guess).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from contract.config import TrainConfig
from contract.gpus import GpuSpec, gpu_type_from_device_name, lookup
from contract.shape import ModelShape
from train.observe.startup import startup_line

logger = logging.getLogger(__name__)


def flops_per_token(arch: dict[str, Any], mean_doc_len: float, lora_params: int | None = None) -> float:
    """6·N + 6·L·a·s̄, with LoRA 4·N + 6·N_lora + 6·L·a·s̄ (contract/shape.py)."""
    return ModelShape.from_arch(arch).flops_per_token(mean_doc_len, lora_params)


def lora_params(arch: dict[str, Any], cfg: TrainConfig) -> int | None:
    """The adapters a token passes through when cfg trains LoRA adapters (an expert's only for its top-k
    experts; all of them for a dense model), else None (full fine-tuning)."""
    if not cfg.lora.enabled:
        return None
    return ModelShape.from_arch(arch).active_lora_params(cfg.lora.r, cfg.lora.target_modules)


def attended_length(doc_lengths: list[int]) -> float:
    """s̄ = Σ nᵢ² / Σ nᵢ: the document length seen by the average token."""
    total = sum(doc_lengths)
    return sum(n * n for n in doc_lengths) / total if total else 0.0


def gpu_spec(configured_gpu_type: str) -> GpuSpec | None:
    """This process's GPU (by its device name, else run.gpu_type); None on CPU or for an unknown GPU."""
    if not torch.cuda.is_available():
        return None
    return lookup(gpu_type_from_device_name(torch.cuda.get_device_name()) or "") or lookup(configured_gpu_type)


def peak_flops_per_gpu(configured_gpu_type: str) -> float | None:
    """Dense bf16 peak FLOP/s of this process's GPU, the one MFU is counted against (under FP8 too:
    train/engine/model.py logs the FP8 peak beside it); None on CPU or for an unknown GPU (warns)."""
    spec = gpu_spec(configured_gpu_type)
    if spec is None and torch.cuda.is_available():
        logger.warning("unknown GPU %r (run.gpu_type=%r): MFU will not be reported", torch.cuda.get_device_name(),
                       configured_gpu_type)
    return spec.peak_tflops_bf16 * 1e12 if spec else None


def mfu_peaks_line(spec: GpuSpec) -> str:
    """What an FP8 run's MFU means: the bf16 peak it is counted against, and the FP8 peak of the GPU."""
    fp8 = f"{spec.peak_tflops_fp8:,.0f}" if spec.peak_tflops_fp8 else "none"
    return f"MFU is counted against the bf16 peak ({spec.peak_tflops_bf16:,.0f} TFLOP/s per {spec.name}); FP8 peak {fp8} TFLOP/s"


def peak_rss_mib() -> float:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def allocator_numbers() -> dict[str, float | int | None]:
    """The caching allocator's state from one `torch.cuda.memory_stats()` read (max_memory_allocated and
    max_memory_reserved each read it whole): peak allocated and peak reserved GiB (what the planner's
    `allocated` and `reserved` predict), and how often it has freed its cache and retried a failed
    cudaMalloc (each a device sync: a run at the edge of the GPU's memory shows it climbing). None on CPU."""
    if not torch.cuda.is_available():
        return {"peak_mem_gib": None, "peak_reserved_gib": None, "alloc_retries": None}
    stats = torch.cuda.memory_stats()
    return {"peak_mem_gib": stats.get("allocated_bytes.all.peak", 0) / 2**30,
            "peak_reserved_gib": stats.get("reserved_bytes.all.peak", 0) / 2**30,
            "alloc_retries": stats.get("num_alloc_retries", 0)}


def step_record(
    *, step: int, epoch: int, loss: float, lr: float, grad_norm: float, tokens: int, doc_len_sq: float,
    seconds: float, world_size: int, arch: dict[str, Any], peak_flops: float | None,
    packing_efficiency: float, elapsed_s: float, compiled_graphs: int = 0, lora_params: int | None = None,
    gc_s: float = 0.0, slowest_step: int = 0, slowest_step_s: float = 0.0,
) -> dict[str, Any]:
    """One metrics.jsonl record for the steps since the last log (tokens/docs summed over all ranks)."""
    tokens_per_s = tokens / seconds if seconds > 0 else 0.0
    per_gpu = tokens_per_s / world_size
    mean_doc = doc_len_sq / tokens if tokens else 0.0
    tflops = flops_per_token(arch, mean_doc, lora_params) * per_gpu / 1e12
    return {
        "step": step, "epoch": epoch, "loss": loss, "lr": lr, "grad_norm": grad_norm,
        "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": per_gpu, "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak_flops if peak_flops else None, **allocator_numbers(),
        "packing_efficiency": packing_efficiency, "elapsed_s": elapsed_s,
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0), "compiled_graphs": compiled_graphs,
        "gc_s": gc_s, "slowest_step": slowest_step, "slowest_step_s": slowest_step_s,
    }


def console_line(record: dict[str, Any], total_steps: int) -> str:
    if record.get("event") == "done":
        return f"done: step {record['step']}/{total_steps}, {record.get('tokens_seen', 0)} tokens"
    if record.get("event") == "startup":
        return startup_line(record)
    if record.get("event") == "checkpoint":
        return (f"checkpoint of step {record['step']} complete ({record['mode']}): training paused "
                f"{record['save_pause_s']:.2f} s for a write of {record['write_s']:.1f} s")
    if "eval_loss" in record:
        return f"step {record['step']}/{total_steps} eval_loss {record['eval_loss']:.4f}"
    mfu = f"{record['mfu'] * 100:.1f}%" if record.get("mfu") is not None else "n/a"
    return (
        f"step {record['step']}/{total_steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
        f"gnorm {record['grad_norm']:.3f} tok/s {record['tokens_per_s']:.0f} "
        f"({record['tokens_per_s_per_gpu']:.0f}/gpu) TFLOP/s/gpu {record['tflops_per_gpu']:.3g} MFU {mfu} "
        f"pack {record['packing_efficiency']:.2f}"
    )


class MetricsSink:
    """Rank-0 writer: metrics.jsonl, console, optional wandb, tqdm progress bar with ETA.

    metrics.jsonl is written whatever `train.report_to` says: `sft-launch status`, `plot` and the
    eval loop read it; report_to adds reporters (wandb), it never takes our own record away."""

    def __init__(self, cfg: TrainConfig, total_steps: int, start_step: int, enabled: bool):
        self.enabled = enabled
        self.total_steps = total_steps
        self.jsonl_path = cfg.run.resolve(cfg.run.metrics_file)
        self.wandb_run = _init_wandb(cfg) if enabled and "wandb" in cfg.train.report_to else None
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                            disable=not sys.stderr.isatty())

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {**record, "total_steps": self.total_steps}  # `sft-launch status` reads it (eta)
        logger.info(console_line(record, self.total_steps))
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.jsonl_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in record.items() if isinstance(v, (int, float))},
                               step=record["step"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def _init_wandb(cfg: TrainConfig) -> Any:
    """wandb run that resumes across requeues (id = run dir name); offline without an API key."""
    import wandb

    has_key = bool(os.environ.get("WANDB_API_KEY")) or (Path.home() / ".netrc").is_file()
    if not has_key:
        os.environ.setdefault("WANDB_MODE", "offline")
    run_dir = Path(cfg.run.dir)
    run_id = (cfg.run.name or run_dir.name).replace("/", "-")
    return wandb.init(project=cfg.run.wandb_project, name=cfg.run.name or run_dir.name, id=run_id,
                      resume="allow", dir=str(run_dir), config=asdict(cfg))


class Stopwatch:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.start = now - self.start, now
        return seconds


class StepClock:
    """Each optimizer step's seconds as the device lived them, read with the window's one host sync, so
    a metrics record names its slowest step (a stall inside a window of N steps is found without a record
    per step, whose own sync costs time).

    On a GPU an event is recorded on the compute stream between steps: two consecutive events bound the
    step, its waits for the host included. On the CPU, where work runs as it is issued, the host clock is
    the step's clock. A span starts at the first step after a sync (a record, a save, an eval), so the
    pauses between spans are never a step's time."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()  # as train/engine/sharding.py picks the device
        self._marks: list[Any] = []
        self._steps: list[int] = []
        self.slowest_step, self.slowest_s = 0, 0.0

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def before_step(self) -> None:
        if not self._marks:
            self._marks.append(self._now())

    def after_step(self, step: int) -> None:
        self._marks.append(self._now())
        self._steps.append(step)

    def settle(self) -> None:
        """After the host waited for the device: the span's steps into `slowest_*`; a new span begins."""
        if self.cuda and self._marks:
            self._marks[-1].synchronize()
        for step, start, end in zip(self._steps, self._marks, self._marks[1:]):
            seconds = start.elapsed_time(end) / 1e3 if self.cuda else end - start
            if seconds > self.slowest_s:
                self.slowest_step, self.slowest_s = step, seconds
        self._marks, self._steps = [], []


@dataclass
class Window:
    """Sums over the optimizer steps since the last log line.

    Each step leaves its numbers as one device tensor in `pending`; `settle` reads them all with a
    single host sync at log / save time, so no step waits for the GPU (the CPU runs ahead and the
    GPU never idles while the next micro-batch is prepared).
    """

    pending: list[torch.Tensor] = field(default_factory=list)  # per step: loss, tokens, Σn², slots, grad norm
    loss: float = 0.0
    steps: int = 0
    tokens: int = 0
    doc_len_sq: float = 0.0
    slots: int = 0
    seconds: float = 0.0
    grad_norm: float = 0.0
    clock: StepClock = field(default_factory=StepClock)  # each step's seconds: the window's slowest step

    def settle(self) -> int:
        """Read the pending steps into the sums; returns their tokens (0 when none are pending)."""
        if not self.pending:
            return 0
        rows = torch.stack(self.pending).tolist()  # the one host sync
        self.pending.clear()
        before = self.tokens
        for loss, tokens, doc_len_sq, slots, grad_norm in rows:
            self.loss += loss
            self.steps += 1
            self.tokens += int(tokens)
            self.doc_len_sq += doc_len_sq
            self.slots += int(slots)
            self.grad_norm = grad_norm
        self.clock.settle()
        return self.tokens - before
