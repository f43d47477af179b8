"""The peers' clock, the same as ours (bench/suites/gpu_single.py): real tokens and wall seconds over the
optimizer steps after bench.report.results_io.WARMUP_STEPS, stopped when the last step's GPU work is done
(inside the Trainer's loop, before its teardown: end-of-train callbacks, model card, memory
release). One micro-batch per optimizer step on every peer (no gradient accumulation)."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import TrainerCallback

from bench.report.results_io import WARMUP_STEPS


class _StepClock(TrainerCallback):
    """Notes the host's time at every step's end (no sync there: the peer runs as it would, so a GPU-side
    stall shows up a step late at most, a host-side one such as a recompile where it happens), and stops
    the clock when the last step's GPU work is done."""

    def __init__(self, clock: TimedSteps):
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):
        last = state.global_step >= state.max_steps
        if last:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.clock.step_ends.append(now)
        if last:
            self.clock.t_end = now


class TimedSteps:
    """Mixin for a transformers Trainer subclass: `count_real_tokens(inputs)` says what a batch holds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.real_tokens, self.step_count = 0, 0
        self.t0: float | None = None
        self.t_end: float | None = None
        self.step_ends: list[float] = []
        self.add_callback(_StepClock(self))

    def count_real_tokens(self, inputs: dict[str, Any]) -> int:
        raise NotImplementedError

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.step_count == WARMUP_STEPS:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()
        if self.step_count >= WARMUP_STEPS:
            self.real_tokens += self.count_real_tokens(inputs)
        self.step_count += 1
        return super().training_step(model, inputs, num_items_in_batch)

    def result(self, path: str) -> dict[str, Any]:
        """The peer's JSON line (bench/suites/gpu_single.py adds the derived numbers)."""
        if self.t0 is None or self.t_end is None:
            raise SystemExit(f"{path}: only {self.step_count} steps, the clock needs more than {WARMUP_STEPS}")
        seconds = self.t_end - self.t0
        return {"path": path, "real_tokens": self.real_tokens, "seconds": seconds,
                "steps": self.step_count - WARMUP_STEPS, "warmup_steps": WARMUP_STEPS,
                "real_tokens_per_s": self.real_tokens / seconds,
                "step_seconds": self.timed_step_seconds(),
                "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                # what the model ran with, read from it (transformers' name: sdpa, flex_attention, ...)
                "attention": getattr(self.model.config, "_attn_implementation", None) or "not recorded"}

    def timed_step_seconds(self) -> list[float]:
        """This rank's host seconds of each timed step (from the clock's start, t0, to each step's end)."""
        ends = self.step_ends[WARMUP_STEPS:]
        return [end - start for start, end in zip([self.t0, *ends[:-1]], ends)]

    def all_ranks(self, result: dict[str, Any]) -> dict[str, Any]:
        """`result` of one rank made the job's: real tokens summed over the ranks (each counted its own
        micro-batches), the longest clock, the largest peak memory."""
        import torch.distributed as dist

        values = torch.tensor([result["real_tokens"], result["seconds"], result["peak_mem_gib"]],
                              dtype=torch.float64, device=torch.cuda.current_device())
        tokens, longest, peak = values.clone(), values.clone(), values.clone()
        dist.all_reduce(tokens, op=dist.ReduceOp.SUM)
        dist.all_reduce(longest, op=dist.ReduceOp.MAX)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        real_tokens, seconds = int(tokens[0]), float(longest[1])
        return {**result, "real_tokens": real_tokens, "seconds": seconds, "real_tokens_per_s": real_tokens / seconds,
                "peak_mem_gib": float(peak[2]), "gpu_count": dist.get_world_size()}
