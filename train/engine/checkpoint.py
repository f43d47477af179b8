"""Preemption-safe checkpoints: temp dir → rename → COMPLETE marker, resume from the newest complete one.

Layout under ``run.checkpoint_dir`` (train/persist/layout.py)::

    .tmp-step-00000050/   being written (all ranks: accelerate save_state + our train_state.json)
    step-00000050/        renamed by rank 0 once every rank's part is written; complete only once it holds COMPLETE

A synchronous save (`save_checkpoint`) returns once complete; an asynchronous one (`Checkpointer`, train.async_save)
returns once staged in CPU memory, its write going on beside training. Accelerate's ``save_state`` writes model (sharded under FSDP), optimizer, registered objects
(the LR scheduler) and one ``random_states_<rank>.pkl`` per process (Python, NumPy, torch CPU and
CUDA RNG), so each rank's RNG comes back on resume. ``train_state.json`` holds the data position.
A crash at any point leaves either a ``.tmp-*`` dir (deleted at the next start, never resumed
from) or a renamed dir without COMPLETE (ignored); the previous complete checkpoint is only pruned
after the new one has its marker, so there is always one to resume from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.checkpointing import save_accelerator_state, save_custom_state
from accelerate.utils import DistributedType
from accelerate.utils.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME

from contract import protocol
from train.engine.hooks import HOOKS
from train.engine.optim import materialize_optimizer_state
from train.persist.layout import MARKER, PREFIX, TMP_PREFIX, failed_save, latest_checkpoint, publish, prune, write_json
from train.persist.snapshot import SnapshotWriter, tensor_bytes, unstageable_tensor
from train.persist.staging import (DISK_SHARE, clear_local, copy_durable, free_bytes, node_local_root,
                                   run_staging_dir)

logger = logging.getLogger(__name__)

STATE_FILE = "train_state.json"


@dataclass
class TrainState:
    """Where training stands. `micro_batch_index` is the next global micro-batch of `epoch`'s plan."""

    step: int = 0
    epoch: int = 0
    micro_batch_index: int = 0
    tokens_seen: int = 0
    elapsed_s: float = 0.0


def remove_stale(root: Path, accelerator: Accelerator) -> None:
    """Delete in-progress saves of a killed run and renamed-but-unmarked dirs (rank 0), then barrier."""
    if accelerator.is_main_process and root.is_dir():
        for path in root.iterdir():
            unfinished = path.name.startswith(PREFIX) and not (path / MARKER).exists()
            if path.name.startswith(TMP_PREFIX) or unfinished:
                logger.warning("removing incomplete checkpoint %s", path)
                shutil.rmtree(path)
    accelerator.wait_for_everyone()


def release_cached_gpu_memory() -> None:
    """Give the caching allocator's free blocks back to the card before a save whose object collectives
    go through NCCL (`object_collectives_on_gpu`).

    Those collectives (DCP's gather_object of the plans to rank 0) open NCCL point-to-point connections
    on first use, whose buffers NCCL allocates outside PyTorch's allocator. After the steps of 8B at
    10,240 tokens per GPU on 4 H100s the allocator held 77.5 GiB of the 80 GB card, and rank 0's gather
    failed with "NCCL Error 1: unhandled cuda error". Over gloo (train.cpu_object_collectives, the
    default) they take no GPU memory, and a release would only make the allocator grow again in the
    steps after the save, so it is skipped there."""
    if object_collectives_on_gpu():
        torch.cuda.empty_cache()


def object_collectives_on_gpu() -> bool:
    """Whether the default group's object collectives run over NCCL: on GPUs, in a group without gloo
    (torch's _get_object_coll_device picks a group's CPU backend when it has one)."""
    return torch.cuda.is_available() and dist.is_initialized() and "gloo" not in dist.get_backend()


def save_checkpoint(accelerator: Accelerator, root: Path, state: TrainState, keep: int) -> Path:
    """Collective: every rank calls it. Returns the complete checkpoint dir.

    A save that finds no room (full disk, quota, file-size limit) removes its partial directory and
    raises CheckpointSpaceError, one line saying where, how much is free and how much a checkpoint
    needs; other errors propagate. Either way the caller exits 1 and the previous checkpoint stays.
    """
    tmp = root / protocol.checkpoint_name(state.step, TMP_PREFIX)
    final = root / protocol.checkpoint_name(state.step)
    started = time.perf_counter()
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    release_cached_gpu_memory()
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            write_json(tmp / STATE_FILE, asdict(state))
        accelerator.wait_for_everyone()
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        raise failed_save(root, tmp, err) from err
    if HOOKS.before_checkpoint_publish is not None:
        HOOKS.before_checkpoint_publish(state.step)
    if accelerator.is_main_process:
        publish(tmp, final)
        prune(root, keep)
    accelerator.wait_for_everyone()
    seconds = time.perf_counter() - started
    if accelerator.is_main_process:
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file()) / 1e9
        logger.info("checkpoint saved: %s (%.2f GB in %.1f s, %.2f GB/s)", final, size, seconds, size / seconds)
    return final


ABANDON_WAIT_S = 30  # how long a failing run waits for its save in flight to end before removing it


@dataclass
class PendingSave:
    """The asynchronous save in flight: its step, folders, and when it started (perf_counter)."""

    step: int
    tmp: Path
    final: Path
    started: float
    pause_s: float


class Checkpointer:
    """The run's saves: periodic ones asynchronous where they can be (train.async_save, FSDP2 sharded state
    that the node's RAM can hold), the stop-save, and the one save in flight. Every method is collective.

    An asynchronous save of step N: every rank copies its shard to CPU memory (the only training pause) and
    writes the small files (RNG states, scheduler, train_state.json: step N's) into .tmp-step-N; a thread
    writes model and optimizer there (DCP, every file fsynced). At each later step boundary the ranks agree
    whether every rank's write is over (`poll`); then rank 0 fsyncs, renames, marks it COMPLETE and prunes.
    A crash before that leaves .tmp-step-N (removed at the next start) and the previous complete checkpoint
    as it was. `record` gets one metrics record per save (pause_s, write_s, GB).

    `staging` (train.async_save_staging): CPU memory, or node-local disk (`node_local_dir`, train/persist/staging.py)."""

    def __init__(self, accelerator: Accelerator, root: Path, keep: int, async_save: bool,
                 vote_group: dist.ProcessGroup | None, timeout: timedelta | None,
                 record: Callable[[dict], None] | None = None, staging: str = "auto", node_local_dir: str = ""):
        self.acc, self.root, self.keep, self.vote_group = accelerator, root, keep, vote_group
        self.staging, self.mode = staging, ""  # the setting; "memory" or "disk" once the first save chose
        self.local = run_staging_dir(node_local_root(node_local_dir), root) / f"rank-{accelerator.process_index}"
        if accelerator.is_local_main_process:
            clear_local(self.local.parent)
        accelerator.wait_for_everyone()
        self.record = record or (lambda _record: None)
        why_not = async_save and sync_only_reason(accelerator)
        if why_not and accelerator.is_main_process:
            logger.info("train.async_save: checkpoints are written synchronously (%s)", why_not)
        self.writer = SnapshotWriter(timeout) if async_save and not why_not else None
        self.pending: PendingSave | None = None
        self.last_write_s: float | None = None  # the last save's time from its start to COMPLETE
        self._checked = False

    def save(self, state: TrainState, began: float | None = None) -> None:
        """The periodic save of `state.step`: returns once staged (async) or complete (sync). A save still
        in flight is finished first: at most one at a time. `began` (perf_counter): when training stopped for
        this save, if the caller already waited for the write in flight: the recorded pause counts that wait."""
        started = time.perf_counter() if began is None else began
        self.finish()
        if self.writer is not None and self._can_stage():
            self._begin(state, started)
            return
        save_checkpoint(self.acc, self.root, state, self.keep)
        self._done(state.step, started, time.perf_counter() - started, "sync")

    def poll(self) -> None:
        """At a step boundary: publish the save in flight if every rank's write is over. Never waits on the
        write; one all-reduce of one integer while a save is in flight, nothing otherwise. At the first boundary
        (the optimizer's state now exists) it decides where saves are staged and, in memory, has the staging
        buffers allocated beside training."""
        if self.writer is not None and not self._checked and self._can_stage() and self.mode == "memory":
            self.writer.prepare(self._state_dicts())
        if self.pending is not None and self.writer is not None and self.writer.all_finished(self.vote_group):
            self._complete()

    def finish(self) -> int | None:
        """Wait for the save in flight (if any) and publish it: at a stop, before the next save, at the end.
        Returns the step it finished, None when none was in flight."""
        if self.pending is None:
            return None
        step = self.pending.step
        self._complete()
        return step

    def stop_save(self, state: TrainState, step_s: float) -> None:
        """The save that answers a stop request (time limit, preemption, Ctrl-C). A save in flight is finished,
        not restarted. Without one, the newest complete checkpoint answers if redoing the steps since it
        (`step_s` each) takes no longer than the last save took; else a synchronous save of this step."""
        if self.pending is not None:
            logger.info("stop: finishing the checkpoint of step %d in flight", self.pending.step)
            self.finish()
            return
        newest = latest_checkpoint(self.root) if self.acc.is_main_process else None
        newest_step = protocol.checkpoint_step(newest) if newest is not None else None
        lost_s = (state.step - newest_step) * step_s if newest_step is not None else math.inf
        reuse = _agreed(self.last_write_s is not None and lost_s <= self.last_write_s, self.vote_group)
        if not reuse:
            started = time.perf_counter()
            save_checkpoint(self.acc, self.root, state, self.keep)
            self._done(state.step, started, time.perf_counter() - started, "sync")
            return
        if self.acc.is_main_process:  # the launcher's rule: a COMPLETE newer than the stop file answers it
            os.utime(newest / MARKER)
            logger.info("stop: %s answers it (%d steps, ~%.0f s to redo, under the %.0f s a save takes)",
                        newest.name, state.step - newest_step, lost_s, self.last_write_s)
        self.acc.wait_for_everyone()

    def close(self) -> None:
        """At the end of the run, also when it fails: a save still in flight then is abandoned (module docstring)."""
        if self.pending is not None:
            self._abandon()
        if self.writer is not None:
            self.writer.close()
        shutil.rmtree(self.local, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last rank of the node removes the run's staging folder
            self.local.parent.rmdir()

    def _abandon(self) -> None:
        """The run failed with a save in flight (a peer died, a collective failed): give this rank's writer a
        moment to end (its collectives fail with the peer's), then remove what it wrote. Whatever a writer still
        stuck leaves, the next start removes (remove_stale); the previous complete checkpoint is untouched."""
        pending, self.pending = self.pending, None
        self.writer.wait(timeout=ABANDON_WAIT_S)
        shutil.rmtree(pending.tmp, ignore_errors=True)
        shutil.rmtree(self.local / pending.tmp.name, ignore_errors=True)

    def _can_stage(self) -> bool:
        """Once, at the first step boundary or save (collective): whether every tensor is one the stager copies (no
        tensor subclass: the same model on every rank), and where: CPU memory if every node can hold its ranks'
        copies there (unless staging = "disk"), else node-local disk if every node has the room (unless "memory")."""
        if self._checked or self.writer is None:
            return self.writer is not None
        self._checked = True
        state_dicts = self._state_dicts()
        subclass, nbytes = unstageable_tensor(state_dicts), tensor_bytes(state_dicts)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        in_ram = self.staging != "disk" and self.writer.fits_in_ram(nbytes, local, self.vote_group, not subclass)
        on_disk = not in_ram and self.staging != "memory" and self.writer.every_rank(
            not subclass and nbytes * local <= DISK_SHARE * free_bytes(self.local), self.vote_group)
        self.mode = "memory" if in_ram else "disk" if on_disk else ""
        shards = f"{local} ranks x {nbytes / 1e9:.2f} GB of state"
        if self.mode and self.acc.is_main_process:
            why = ("train.async_save_staging = disk" if self.staging == "disk" else
                   f"{shards} fit in this node's available RAM" if in_ram else
                   f"{shards} do not fit in this node's available RAM")
            where = "in CPU memory" if in_ram else f"on node-local disk ({self.local.parent}), copied in the background"
            logger.info("train.async_save: each save is staged %s (%s)", where, why)
        if self.mode:
            return True
        if self.acc.is_main_process:
            why = (f"its state holds {subclass} tensors" if subclass else f"{shards} do not fit in this node's "
                   + ("available RAM" if self.staging == "memory" else f"available RAM nor on {self.local.parent}"))
            logger.warning("train.async_save: %s; checkpoints are written synchronously", why)
        self.writer.close()
        self.writer = None
        return False

    def _state_dicts(self) -> dict[str, dict]:
        """This rank's shard of model and optimizer as Accelerate's FSDP2 save lays them out (load_state reads it)."""
        from accelerate.utils.fsdp_utils import _prepare_sd_options
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        model, optimizer = self.acc._models[0], self.acc._optimizers[0]
        # Accelerate's sharded options offload to CPU: a synchronous copy of every tensor into fresh pageable memory
        # (on one H100, 25.7 GB took ~25 s, twice at the first save), which the stager then copies again. The
        # stager (or DCP, for disk staging) makes the one CPU copy; the layout written is the same.
        options = dataclasses.replace(_prepare_sd_options(self.acc.state.fsdp_plugin), cpu_offload=False)
        return {f"{FSDP_MODEL_NAME}_0": {"model": get_model_state_dict(model, options=options)},
                f"{OPTIMIZER_NAME}_0": {"optimizer": get_optimizer_state_dict(model, optimizer, options=options)}}

    def _begin(self, state: TrainState, started: float) -> None:
        tmp = self.root / protocol.checkpoint_name(state.step, TMP_PREFIX)
        if self.acc.is_main_process:  # made once, here: a rank whose save fails removes it, and none makes it anew
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self.acc.wait_for_everyone()
        step, local = state.step, self.local / tmp.name

        def copied(path: Path) -> None:
            if HOOKS.checkpoint_file_copied is not None:
                HOOKS.checkpoint_file_copied(step, path)

        try:
            if self.mode == "disk":  # written and fsynced on this node (the pause), copied in the background
                shutil.rmtree(local, ignore_errors=True)
                live = self._state_dicts()
                self.writer.write_now([(live[name], local / name) for name in live])
                job = partial(copy_durable, local, tmp, copied)
            else:
                staged = self.writer.stage(self._state_dicts())
                job = partial(self.writer.write_staged, [(staged[name], tmp / name) for name in staged])
            _save_small_state(self.acc, tmp, state)
            self.writer.submit_job(job, after=lambda: HOOKS.before_checkpoint_publish
                                   and HOOKS.before_checkpoint_publish(step))
        except BaseException as err:  # this rank's small files found no room (the other ranks' writes then fail)
            shutil.rmtree(local, ignore_errors=True)
            raise failed_save(self.root, tmp, err) from err
        pause = time.perf_counter() - started
        self.pending = PendingSave(step, tmp, self.root / protocol.checkpoint_name(step), started, pause)
        if self.acc.is_main_process:
            logger.info("checkpoint of step %d staged in %.2f s (%s); written in the background", step, pause,
                        self.mode)

    def _complete(self) -> None:
        """Every rank's write is over (or this rank waits for its own): publish, or clean up and raise."""
        pending, self.pending = self.pending, None
        error = self.writer.wait()
        failed = _agreed(error is not None, self.vote_group, any_rank=True)
        if failed:
            shutil.rmtree(self.local / pending.tmp.name, ignore_errors=True)
            error = error or RuntimeError(f"checkpoint write of {pending.tmp} failed on another rank; "
                                          f"{latest_checkpoint(self.root) or 'no checkpoint'} is kept")
            raise failed_save(self.root, pending.tmp, error) from error
        if self.acc.is_main_process:
            publish(pending.tmp, pending.final)
            prune(self.root, self.keep)
        self._done(pending.step, pending.started, pending.pause_s, "async")

    def _done(self, step: int, started: float, pause_s: float, mode: str) -> None:
        self.last_write_s = time.perf_counter() - started
        if not self.acc.is_main_process:
            return
        final = self.root / protocol.checkpoint_name(step)
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file()) / 1e9
        if mode == "async":  # the line save_checkpoint writes for a synchronous save, the same words
            logger.info("checkpoint saved: %s (%.2f GB in %.1f s, %.2f GB/s)", final, size, self.last_write_s,
                        size / self.last_write_s)
        staging = {"staging": self.mode} if mode == "async" else {}
        self.record({"event": "checkpoint", "step": step, "mode": mode, **staging, "save_pause_s": pause_s,
                     "write_s": self.last_write_s, "gb": size})


def sync_only_reason(accelerator: Accelerator) -> str:
    """Why this run's saves cannot be asynchronous ("" = they can): the staging copies FSDP2's sharded state."""
    if accelerator.distributed_type != DistributedType.FSDP or not accelerator.is_fsdp2:
        return f"{accelerator.distributed_type.value}: only FSDP2's sharded state is staged and written behind training"
    from torch.distributed.fsdp import StateDictType

    if accelerator.state.fsdp_plugin.state_dict_type != StateDictType.SHARDED_STATE_DICT:
        return "fsdp_state_dict_type is not SHARDED_STATE_DICT"
    if len(accelerator._models) != 1 or len(accelerator._optimizers) != 1:
        return "one model and one optimizer are staged, this run prepared more"
    return ""


def _agreed(local: bool, group: dist.ProcessGroup | None, any_rank: bool = False) -> bool:
    """Rank 0's `local` on every rank; with `any_rank`, whether any rank's is true. Collective."""
    if not (dist.is_available() and dist.is_initialized()):
        return local
    vote = local and (any_rank or dist.get_rank() == 0)
    flag = torch.tensor([1 if vote else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())


def _save_small_state(accelerator: Accelerator, folder: Path, state: TrainState) -> None:
    """What Accelerate's save_state writes besides model and optimizer (RNG of this rank, scheduler and the
    other registered objects), and our train_state.json: step N's, written before training goes on. `folder` is
    rank 0's (_begin): gone, it was removed by a rank whose save failed, and the write fails for want of it."""
    each_node = accelerator.project_configuration.save_on_each_node
    save_accelerator_state(str(folder), [], [], accelerator._schedulers, accelerator._dataloaders,
                           accelerator.state.process_index, accelerator.step, accelerator.scaler,
                           save_on_each_node=each_node)
    for index, obj in enumerate(accelerator._custom_objects):
        save_custom_state(obj, str(folder), index, save_on_each_node=each_node)
    if accelerator.is_main_process:
        write_json(folder / STATE_FILE, asdict(state))


def load_checkpoint(accelerator: Accelerator, path: Path) -> TrainState:
    """Collective: restores model, optimizer, scheduler, RNG of this rank; returns the data position."""
    started = time.perf_counter()
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        for optimizer in accelerator._optimizers:
            materialize_optimizer_state(optimizer.optimizer)
    accelerator.load_state(str(path))
    data = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    state = TrainState(**data)
    logger.info("resumed from %s (step %d, epoch %d, micro-batch %d) in %.1f s", path, state.step, state.epoch,
                state.micro_batch_index, time.perf_counter() - started)
    return state

