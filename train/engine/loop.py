"""The training loop, top to bottom: data → model → resume → steps (stop check, save, log, eval) → export.

Data position: the global plan of micro-batches for an epoch is a deterministic function of
(lengths, budget, seed, epoch) (``train.dataset.packing.plan_micro_batches``); rank r of W takes global
micro-batches r, r+W, …; one optimizer step consumes ``gradient_accumulation_steps`` of them per
rank. ``TrainState.micro_batch_index`` is the next global micro-batch, so resuming needs no replay.

Loss normalisation: the gradient must be that of Σ(token losses of the step, all ranks) / (label
tokens of the step, all ranks), whatever the token counts of the individual micro-batches. The
label-token count is all-reduced once per step before the forwards; each micro-batch's loss is its
token-loss *sum* divided by (count / W) — ``num_items_in_batch`` in transformers' loss — because
DDP/FSDP average gradients over the W ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from contract.config import TrainConfig
from contract.protocol import (EXIT_REQUEUE, FINISHED_FILE, LOGS_DIR, PROFILE_DIR, periodic_save_ahead,
                               periodic_save_due)
from contract.schema import ConfigError
from contract.sources import Mixture
from train.kernels import float8
from train.kernels.attention import setup_attention
from train.kernels.context_parallel import ContextParallel, label_tokens, register_attention
from train.kernels.context_parallel import setup as setup_context_parallel
from train.moe import expert_parallel
from train.kernels.long_context import ActivationOffload
from train.engine.checkpoint import Checkpointer, TrainState, latest_checkpoint, load_checkpoint, remove_stale
from train.dataset.load import build_datasets, load_tokenizer, pad_id
from train.engine.export import export_model
from train.engine.hooks import HOOKS
from train.moe.router import router_loss_of
from train.observe.metrics import (MetricsSink, Stopwatch, Window, attended_length, lora_params, peak_flops_per_gpu,
                                   step_record)
from train.engine.model import (attention_features, attention_heads, build_model, log_model_ready, log_placement,
                                moe_experts, weights_in_checkpoint)
from train.engine.optim import backward, clip_and_step, defers_gradient_sync, norm_tensor, prepare_for_training
from train.dataset.packing import collate, plan_micro_batches, to_device
from train.engine.heldout import eval_sums, loss_record
from train.kernels.perf import RecompileWatch, StepGarbageCollector, compiles_decoder_layers, make_deterministic
from train.observe.profiling import StepProfiler
from train.observe.startup import StartupClock
from train.engine.stop import Finished, StopRequest
from train.engine.watchdog import Watchdog

logger = logging.getLogger(__name__)


@dataclass
class Batches:
    """Turns plan indices into collated micro-batches for this rank."""

    dataset: Any
    lengths: list[int]
    budget: int
    seed: int
    packed: bool
    pad_id: int
    mixture: Mixture | None = None  # several sources / weights: the examples each epoch takes
    fixed_length: bool = False  # packed rows filled up to the budget (compiled layers: train/dataset/packing.py)
    cp: ContextParallel = field(default_factory=ContextParallel)  # this rank's slice of each row (parallel.context)
    _plans: dict[int, list[list[int]]] = field(default_factory=dict)

    def plan(self, epoch: int) -> list[list[int]]:
        if epoch not in self._plans:
            self._plans = {epoch: self._plan(epoch)}
        return self._plans[epoch]

    def _plan(self, epoch: int) -> list[list[int]]:
        """The epoch's micro-batches: of every example (one plain source), else of the mixture's choice."""
        if self.mixture is None or self.mixture.is_plain:
            return plan_micro_batches(self.lengths, self.budget, self.seed, epoch)
        chosen = self.mixture.select(self.seed, epoch)
        bins = plan_micro_batches([self.lengths[i] for i in chosen], self.budget, self.seed, epoch)
        return [[chosen[j] for j in micro_batch] for micro_batch in bins]

    def collate(self, indices: list[int]) -> dict[str, Any]:
        """The micro-batch on the CPU (counting its tokens there costs no device sync); this rank's slice
        of it under context parallelism."""
        examples = [self.dataset[i] for i in indices]
        return self.cp.shard(collate(examples, self.packed, self.pad_id, self.row_length), self.pad_id)

    @property
    def row_length(self) -> int | None:
        """The length every packed row is filled up to; None: rows as long as their documents."""
        return self.budget if self.fixed_length and self.packed else None

    def real_lengths(self, indices: list[int]) -> list[int]:
        """The document tokens of a micro-batch as collated (fixed-length rows truncate to the budget);
        the filler is never one of them."""
        cap = self.row_length
        return [min(self.lengths[i], cap) if cap else self.lengths[i] for i in indices]


def train(cfg: TrainConfig, accelerator: Accelerator, startup: StartupClock | None = None) -> int:
    """Run (or resume) training; returns the process exit code (0 done, 75 stopped and saved). `startup`
    times each phase up to the first step (train/observe/startup.py)."""
    startup = startup or StartupClock()
    make_deterministic(cfg.train.deterministic)
    set_seed(cfg.train.seed)  # same init on every rank
    log_placement(accelerator)
    stop = StopRequest(cfg.run.resolve(cfg.run.stop_file), accelerator.device,
                       timedelta(seconds=cfg.run.collective_timeout_s))
    stop.install_signal_handlers()
    ckpt_root = cfg.run.resolve(cfg.run.checkpoint_dir)
    remove_stale(ckpt_root, accelerator)
    latest = latest_checkpoint(ckpt_root)
    stop.clear_answered_file(accelerator.is_main_process, latest)
    finished = Finished(cfg.run.resolve(FINISHED_FILE), accelerator.is_main_process)
    if latest is not None and weights_in_checkpoint(cfg, accelerator):
        logger.info("resuming a full fine-tune: every weight comes from %s; %s is not read", latest.name,
                    cfg.model.path)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init="sharded"))
    startup.mark("setup")

    tokenizer = load_tokenizer(cfg)
    # Rank 0 tokenizes and caches; the others wait at the barrier, then read the cache.
    bundle = build_datasets(cfg, tokenizer, is_main=accelerator.is_main_process,
                            barrier=accelerator.wait_for_everyone)
    cp = setup_context_parallel(cfg.parallel.context, accelerator.num_processes, accelerator.process_index,
                                *attention_heads(cfg))
    ep = expert_parallel.setup(cfg.parallel.expert, accelerator.num_processes, accelerator.process_index,
                               *(moe_experts(cfg) if cfg.parallel.expert > 1 else (None, None)))
    batches = Batches(bundle.train, list(bundle.train["length"]), cfg.micro_batch_tokens, cfg.train.seed,
                      cfg.data.packing, pad_id(tokenizer), bundle.mixture,
                      fixed_length=compiles_decoder_layers(cfg, accelerator.num_processes), cp=cp)
    attn = register_attention(
        setup_attention(cfg.model.attn_implementation, accelerator.device, cfg.data.packing,
                        attention_features(cfg)), cp)
    startup.mark("data")
    started = time.perf_counter()
    model = build_model(cfg, accelerator, attn)
    expert_parallel.split_experts(accelerator, model, ep)  # before prepare: FSDP2 groups the experts apart
    startup.mark("model_build")

    steps_per_epoch = _steps_per_epoch(batches, cp.data_world(accelerator.num_processes),
                                       cfg.train.gradient_accumulation_steps)
    total_steps = cfg.train.max_steps if cfg.train.max_steps > 0 else math.ceil(
        cfg.train.num_train_epochs * steps_per_epoch)
    model, optimizer, scheduler = prepare_for_training(accelerator, model, cfg, total_steps)
    log_model_ready(accelerator, started)
    startup.mark("prepare")

    state = TrainState()
    if latest is not None:
        state = load_checkpoint(accelerator, latest)  # restores RNG last: nothing may consume it after
    startup.mark("checkpoint_load")
    _log_summary(cfg, accelerator, bundle.stats, batches, steps_per_epoch, total_steps, state)

    loop = Loop(cfg, accelerator, model, optimizer, scheduler, batches, bundle.eval_sets, total_steps,
                steps_per_epoch)
    sink = MetricsSink(cfg, total_steps, state.step, enabled=accelerator.is_main_process)
    # No periodic save ahead: no writer, no staging buffers pinned.
    saves_ahead = periodic_save_ahead(state.step, cfg.train.save_steps, total_steps)
    if cfg.train.async_save and not saves_ahead and accelerator.is_main_process:
        logger.info("train.async_save: no periodic save before step %d; a stop-save is synchronous", total_steps)
    saver = Checkpointer(accelerator, ckpt_root, cfg.train.save_total_limit, cfg.train.async_save and saves_ahead,
                         stop.group, timedelta(seconds=cfg.run.collective_timeout_s), sink.write,
                         cfg.train.async_save_staging, cfg.run.node_local_dir)
    watchdog = Watchdog(Path(cfg.run.dir), cfg.run.hang_timeout_s)
    watchdog.start(state.step)
    try:
        with loop.collector:
            stopped = loop.run(state, stop, sink, saver, watchdog, startup)
        if stopped:
            stop.restore_default_handlers()
            return EXIT_REQUEUE
        with watchdog.paused():  # the final eval and the export are not steps
            if loop.evals and loop.evaluated_at != state.step:  # the last step's eval may have been this one
                sink.write({"step": state.step, "epoch": state.epoch, **loop.evaluate()})
            if cfg.run.export_dir:  # "" = no export (benchmarks: an 8B gather and a 32 GB write)
                export_model(accelerator, model, tokenizer, cfg)
        sink.write({"event": "done", "step": state.step, "epoch": state.epoch, "elapsed_s": state.elapsed_s,
                    "tokens_seen": state.tokens_seen})
        finished.mark(state.step)
    finally:
        saver.close()
        watchdog.close()
        sink.close()
    return 0


def _steps_per_epoch(batches: Batches, world: int, accumulation: int) -> int:
    per_step = world * accumulation
    n = len(batches.plan(0)) // per_step
    if n == 0:
        raise ConfigError(
            f"data.tokens_per_micro_batch: the data packs into {len(batches.plan(0))} micro-batches, fewer than "
            f"one optimizer step needs ({world} ranks x {accumulation} accumulation); lower the budget",
            "data.tokens_per_micro_batch")
    return n


def _log_summary(cfg: TrainConfig, accelerator: Accelerator, stats: Any, batches: Batches,
                 steps_per_epoch: int, total_steps: int, state: TrainState) -> None:
    if not accelerator.is_main_process:
        return
    plan = batches.plan(0)
    real = sum(n for micro_batch in plan for n in batches.real_lengths(micro_batch))
    slots = len(plan) * batches.budget
    for source in stats.get("sources", []):
        logger.info("source %s: %d examples (%d rows, %d skipped), %d per epoch, %d eval", source["name"],
                    source["train_examples"], source["rows"], source["skipped"], source["epoch_examples"],
                    source["eval_examples"])
    per_step = cfg.micro_batch_tokens * cfg.train.gradient_accumulation_steps * batches.cp.data_world(
        accelerator.num_processes)
    data_stats = {k: stats.get(k) for k in ("rows", "skipped", "truncated", "eval_examples")}
    logger.info(
        "world size %d (%s) | %d examples, %d tokens, data stats %s | %d micro-batches/epoch, "
        "packing efficiency %.3f | token slots per optimizer step %d | %d steps/epoch, %d steps total, "
        "starting at step %d", accelerator.num_processes, accelerator.distributed_type,
        sum(len(micro_batch) for micro_batch in plan),
        real, data_stats, len(plan), real / slots if slots else 0.0, per_step, steps_per_epoch, total_steps,
        state.step)
    if batches.row_length:
        logger.info("packed rows filled up to %d tokens with a filler segment (compiled decoder layers see one "
                    "shape); the filler is not counted as tokens", batches.row_length)
    if over := [n for n in batches.lengths if n > batches.budget]:  # the planner names them before the queue too
        logger.warning("%d document(s) longer than the %d-token micro-batch (longest %d): %s; keep them whole with a "
                       "micro-batch that holds them, split over GPUs with --context_parallel", len(over),
                       batches.budget, max(over), "cut to it" if batches.row_length else "each alone in a longer row")


class Loop:
    def __init__(self, cfg: TrainConfig, accelerator: Accelerator, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, scheduler: Any, batches: Batches, evals: dict[str, Any],
                 total_steps: int, steps_per_epoch: int):
        self.cfg, self.acc, self.model = cfg, accelerator, model
        self.optimizer, self.scheduler, self.batches = optimizer, scheduler, batches
        self.evals, self.total_steps, self.steps_per_epoch = evals, total_steps, steps_per_epoch
        self.world, self.rank = accelerator.num_processes, accelerator.process_index
        # Ranks reading different micro-batches: context-parallel ranks share theirs (one slice each).
        self.data_world, self.data_rank = batches.cp.data_world(self.world), batches.cp.data_rank(self.rank)
        self.accumulation = cfg.train.gradient_accumulation_steps
        self.peak_flops = peak_flops_per_gpu(cfg.run.gpu_type)
        self.arch = accelerator.unwrap_model(model).config.to_dict()
        self.lora_params = lora_params(self.arch, cfg)  # MFU counts a frozen base at 4·N
        self.router = router_loss_of(accelerator.unwrap_model(model))  # MoE: aux loss and expert load
        self.recompiles = RecompileWatch()
        self.collector = StepGarbageCollector(cfg.train.gc_every_steps)  # entered around run() by train()
        self.float8_all_gather = float8.all_gathers_in_float8(model)
        offload = ActivationOffload(accelerator.device) if cfg.train.activation_offload else None
        self.saving = offload.saving if offload else contextlib.nullcontext  # around each training forward
        self.evaluated_at = -1  # the step of the last eval: the final one is not repeated there

    def run(self, state: TrainState, stop: StopRequest, sink: MetricsSink, saver: Checkpointer,
            watchdog: Watchdog, startup: StartupClock) -> bool:
        """Train until total_steps; True when stopped (and saved) on request. Saves and evals pause the
        watchdog; every completed optimizer step (its stop vote included) is progress. An asynchronous save
        is published at the first step boundary after every rank's write is over, and finished at the end."""
        window, watch = Window(), Stopwatch()
        profiler = StepProfiler(self.cfg.train.profile_steps or "", self.acc.is_main_process,
                               Path(self.cfg.run.dir) / LOGS_DIR / PROFILE_DIR)
        self.model.train()
        if self.float8_all_gather:  # the first step casts with precomputed scales too, resumed or not
            float8.precompute_scales(self.model)
        resumed_at = state.step
        startup.mark("loop_setup")
        while state.step < self.total_steps:
            lr = self.scheduler.get_last_lr()[0]
            profiler.before_step(state.step)
            window.clock.before_step()
            self.step(state, window)
            window.clock.after_step(state.step)
            if not startup.done:  # one device wait, once: the first step's end as the device lived it
                _synchronize(self.acc.device)
                sink.write(startup.record(state.step, resumed=resumed_at > 0))
            profiler.after_step(state.step - 1)
            self.collector.after_step(state.step)  # inside the window's clock: its pause is training time
            sink.advance()
            if state.step % self.cfg.train.logging_steps == 0 or state.step == self.total_steps:
                self._settle(state, window, watch)
                sink.write(self.record(state, window, lr))
                window = Window()
            if self.cfg.train.eval_steps and state.step % self.cfg.train.eval_steps == 0 and self.evals:
                self._settle(state, window, watch)
                with watchdog.paused():
                    sink.write({"step": state.step, "epoch": state.epoch, **self.evaluate()})
                self.evaluated_at = state.step
                watch.lap()  # eval is not training throughput
            if HOOKS.after_step is not None:
                HOOKS.after_step(state.step, self.acc.is_main_process, stop.stop_file)
            stopping = stop.agreed(state.step, self.acc.is_main_process)
            watchdog.progress(state.step)
            saver.poll()
            if stopping:
                self._settle(state, window, watch)  # tokens_seen must be exact in the checkpoint
                with watchdog.paused():
                    saver.stop_save(state, state.elapsed_s / max(1, state.step))
                return True
            if periodic_save_due(state.step, self.cfg.train.save_steps, self.total_steps):
                self._settle(state, window, watch)
                with watchdog.paused():
                    # One save at a time: the one in flight first. A stop that came while waiting for it (a
                    # preemption during the write) is answered by that save, not by starting another write.
                    began = time.perf_counter()  # the wait for the write in flight is part of this save's pause
                    in_flight = saver.finish()
                    if in_flight is not None and stop.agreed(state.step, self.acc.is_main_process):
                        logger.info("stop: the checkpoint of step %d, in flight when the stop came, is finished",
                                    in_flight)
                        saver.stop_save(state, state.elapsed_s / max(1, state.step))
                        return True
                    saver.save(state, began)
                self.collector.collect(state.step)  # in the pause the save took anyway
                watch.lap()  # saving (and its collection) is not training throughput
        self._settle(state, window, watch)
        with watchdog.paused():
            saver.finish()
        return False

    @staticmethod
    def _settle(state: TrainState, window: Window, watch: Stopwatch) -> None:
        """Wait for the GPU (one sync), then book the wall time since the last lap as training time."""
        state.tokens_seen += window.settle()
        seconds = watch.lap()
        window.seconds += seconds
        state.elapsed_s += seconds

    def _my_micro_batches(self, state: TrainState) -> list[list[int]]:
        plan = self.batches.plan(state.epoch)
        first = state.micro_batch_index
        return [plan[first + k * self.data_world + self.data_rank] for k in range(self.accumulation)]

    def _advance(self, state: TrainState) -> None:
        state.step += 1
        state.micro_batch_index += self.data_world * self.accumulation
        if state.micro_batch_index + self.data_world * self.accumulation > len(self.batches.plan(state.epoch)):
            state.epoch, state.micro_batch_index = state.epoch + 1, 0

    def step(self, state: TrainState, window: Window) -> None:
        """One optimizer step over this rank's micro-batches. Enqueues GPU work only: the step's
        numbers go to `window.pending` as a device tensor (no host sync)."""
        index_lists = self._my_micro_batches(state)
        micro_cpu = [self.batches.collate(ix) for ix in index_lists]
        books = self.batches.cp.rank == 0  # a context-parallel group's documents are counted once
        doc_lengths = [n for ix in index_lists for n in self.batches.real_lengths(ix)] if books else []
        slots = sum(b["input_ids"].numel() if not self.cfg.data.packing else self.batches.budget
                    for b in micro_cpu) if books else 0
        counts = torch.tensor([sum(label_tokens(b) for b in micro_cpu), sum(doc_lengths),
                               attended_length(doc_lengths) * sum(doc_lengths), slots], dtype=torch.float64)
        counts = self.acc.reduce(to_device({"c": counts}, self.acc.device)["c"], reduction="sum")
        micro = [to_device(b, self.acc.device) for b in micro_cpu]
        items_per_rank = torch.clamp(counts[0], min=1.0).float() / self.world
        loss_sum = torch.zeros((), device=self.acc.device)
        for i, batch in enumerate(micro):
            last = i == len(micro) - 1
            with self.acc.no_sync(self.model) if defers_gradient_sync(self.acc, last) else contextlib.nullcontext():
                with self.saving():
                    loss = self.model(**batch, num_items_in_batch=items_per_rank).loss
                backward(self.acc, loss, last)
            loss_sum += loss.detach().float()
        max_norm = self.cfg.train.max_grad_norm if self.cfg.train.max_grad_norm > 0 else float("inf")
        norm = clip_and_step(self.acc, self.optimizer, list(self.model.parameters()), max_norm)
        grad_norm = norm_tensor(norm, self.acc.device)
        if self.float8_all_gather:  # the new weights' float8 scales, in one all-reduce for all of them
            float8.precompute_scales(self.model)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_mean = self.acc.reduce(loss_sum, reduction="mean")
        window.pending.append(torch.stack([loss_mean.double(), counts[1], counts[2], counts[3], grad_norm.double()]))
        self._advance(state)

    def record(self, state: TrainState, window: Window, lr: float) -> dict[str, Any]:
        record = step_record(
            step=state.step, epoch=state.epoch, loss=window.loss / max(1, window.steps), lr=lr,
            grad_norm=window.grad_norm, tokens=window.tokens, doc_len_sq=window.doc_len_sq,
            seconds=window.seconds, world_size=self.world, arch=self.arch, peak_flops=self.peak_flops,
            packing_efficiency=window.tokens / window.slots if window.slots else 0.0, elapsed_s=state.elapsed_s,
            compiled_graphs=self.recompiles.check(state.step), lora_params=self.lora_params,
            gc_s=self.collector.take_seconds(), slowest_step=window.clock.slowest_step,
            slowest_step_s=window.clock.slowest_s)
        if self.router is not None:  # this rank's tokens since the last record (train/moe/router.py)
            record.update(self.router.drain())
        return record

    def evaluate(self) -> dict[str, float]:
        """`eval_loss`: mean token loss over every eval example; with several sources also
        `eval_loss/<source>`, each source's own (train/engine/heldout.py)."""
        b = self.batches
        return loss_record({name: eval_sums(self.model, dataset, b.budget, self.cfg.train.seed, b.packed, b.pad_id,
                                            self.acc.device, self.world, self.rank, b.row_length, b.cp)
                            for name, dataset in self.evals.items()})


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
