"""One checkpoint write in flight beside training: stage to CPU memory, write in a thread, agree when done.

The training pause of an asynchronous save is the staging alone: every tensor of this rank's shard is
copied into CPU buffers allocated once and reused by every save (`CpuStager`). On GPUs they are one flat
allocation registered with CUDA (pinned), so the copy runs at PCIe speed: on one H100 (2026-12-06) the
first save of 25.7 GB paused training 0.48 s. The buffers are prepared in a background thread at the run's
first step boundary; registering all 25.7 GB in one cudaHostRegister there (which faults the fresh pages
in while holding the CUDA driver's lock) stalled the training thread's CUDA calls ~13.6 s, so the pages
are faulted in first and registered in pieces (`pin_groups`). The copy is the snapshot of step N: the
next optimizer step may change the live tensors while the thread writes it. DCP writes it with
`STAGED_WRITE_THREADS` threads (one thread wrote 0.36 GB/s on a disk dd wrote at 1.26 GB/s).
Why not torch's DefaultStager: with pinned memory (torch 2.11, the GPU image) its second `stage` raised
`KeyError: <class 'type'>` both in a bare script and in a training run on the H200, and its first
one paused the 8B-layer run for 57 s (an allocation and a host registration per storage).

Why a thread of ours over `torch.distributed.checkpoint.async_save`: async_save with its THREAD executor
does the same two things (DefaultStager, then `dcp.save` in a one-worker thread pool), once per state
dict; Accelerate's layout, which `load_state` reads, is two DCP saves (model, optimizer) into two
folders, and our checkpoint is valid only after both and after every rank's files are durable. One
job in one thread writes both in order, then runs the caller's `after` (fault hooks, fsync); the
ranks agree at a step boundary that every rank's job is over (`all_finished`, one all-reduce of one
integer). torch's PROCESS executor would start a child process with a process group of its own for
each save; on SLURM that is a second rendezvous per job for no gain here (the thread's writes release
the GIL).

The thread's collectives (DCP's plan and metadata gathers) run on a gloo group of their own: on the
group training uses, two threads' collectives would interleave.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.tensor import DTensor

from contract import protocol

logger = logging.getLogger(__name__)

# The most bytes one cudaHostRegister of the staging buffers pins: the registration holds the CUDA driver's lock,
# which the training thread's CUDA calls wait for. Whole tensors only, a larger one alone: a copy into host memory is
# pinned only if the tensor's bytes lie in one registered range (else CUDA takes the memory as pageable).
PIN_GROUP_BYTES = 512 * 2**20
# Threads (and files per rank and folder) DCP writes a staged save with: its one thread wrote 0.36 GB/s on one H100
# node whose disk dd wrote at 1.26 GB/s (2026-12-06). With several, torch's FileSystemWriter splits this rank's items
# into as many files by size and writes each in a thread of its own; staged tensors are CPU tensors owning exactly their
# bytes, so its _SerialCpuLoader writes them as they are (no .cpu() copy, no clone). Its threads, started from our
# daemon writer thread, are daemons too (`submit_job`: a failed run does not wait for them at exit).
STAGED_WRITE_THREADS = 4


def pin_groups(sizes: list[int], cap: int) -> list[range]:
    """Consecutive runs of the tensors of byte sizes `sizes` (index ranges, covering every tensor once, in order),
    each at most `cap` bytes unless one tensor alone is larger."""
    groups: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        if index > start and total + size > cap:
            groups.append(range(start, index))
            start, total = index, 0
        total += size
    if sizes:
        groups.append(range(start, len(sizes)))
    return groups


def staging_layout(sizes: list[int], align: int, page: int, cap: int) -> tuple[list[int], list[tuple[int, int]], int]:
    """Where each tensor of byte sizes `sizes` goes in one flat buffer: (its offset, `align`-aligned; the (offset,
    length) of each range registered with CUDA, one per `pin_groups` group, starting at a `page` boundary so that no two
    share a page; the buffer's length). Zero-length ranges (only empty tensors) are left out."""
    offsets, ranges, end = [], [], 0
    slots = [-(-size // align) * align for size in sizes]
    for group in pin_groups(slots, cap):
        start = end = -(-end // page) * page
        for index in group:
            offsets.append(end)
            end += slots[index]
        if end > start:
            ranges.append((start, end - start))
    return offsets, ranges, end


def cpu_group(timeout: timedelta | None) -> dist.ProcessGroup | None:
    """A gloo group for small CPU collectives of the main thread (None = the default group, already gloo,
    or no world). Collective: every rank creates it at the same point. `timeout`: a new group does not
    inherit the default group's (gloo's own default is 30 minutes)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


def tensor_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict, a DTensor counted by its local shard."""
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(tensor_bytes(value) for value in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    return 0


def unstageable_tensor(state: Any) -> str:
    """The type of the first tensor the stager cannot copy as plain storage ("" = none): a tensor subclass other
    than DTensor and Parameter, or a DTensor over one (QLoRA's NF4 weights, float8 all-gather's weight wrapper)."""
    if isinstance(state, dict):
        return next((found for value in state.values() if (found := unstageable_tensor(value))), "")
    if isinstance(state, list | tuple):
        return next((found for value in state if (found := unstageable_tensor(value))), "")
    if not isinstance(state, torch.Tensor):
        return ""
    local = state.to_local() if hasattr(state, "to_local") else state
    return "" if type(local) in (torch.Tensor, torch.nn.Parameter) else type(local).__name__


class CpuStager:
    """CPU copies of a state dict's tensors in buffers kept from one save to the next.

    `prepare` (or else the first `stage`) allocates one flat byte buffer for every tensor (pinned when `pin`: one
    cudaHostRegister per `pin_groups` group of whole tensors), each tensor a view into it at an aligned offset;
    every stage copies into the same views. The structure is rebuilt
    each time (new dicts and lists: the scheduler may change a param group's lr while the thread
    writes); a DTensor comes back as a DTensor over its staged local shard with the same spec, so DCP
    writes the same layout. A state whose tensors changed shape or dtype gets new buffers."""

    ALIGN = 512

    def __init__(self, pin: bool):
        self._pin = pin
        self._flat: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._registered: list[int] = []  # the start of each range registered with CUDA
        self._preparing: threading.Thread | None = None

    def prepare(self, state: Any) -> None:
        """Allocate (and pin) the buffers for `state`'s tensors in a background thread, so that the first `stage`
        only copies: allocating and pinning 25.7 GB inside the first save had paused it 10.1 s on one H100
        (2026-12-06). The thread's driver calls still stall training's CUDA calls while each holds the driver's lock:
        hence the pages are faulted in before, and registered in pieces (`_allocate`)."""
        tensors: list[torch.Tensor] = []
        _collect_local(state, tensors)
        device = torch.cuda.current_device() if self._pin else None

        def allocate() -> None:
            if device is not None:
                torch.cuda.set_device(device)  # else the thread's CUDA calls would create a context on GPU 0
            self._allocate(tensors)

        self._preparing = threading.Thread(target=allocate, name="checkpoint-staging-buffers", daemon=True)
        self._preparing.start()

    def stage(self, state: Any) -> Any:
        if self._preparing is not None:  # a failed preparation leaves no buffers: they are allocated below
            self._preparing.join()
            self._preparing = None
        tensors: list[torch.Tensor] = []
        _collect_local(state, tensors)
        if [(t.shape, t.dtype) for t in tensors] != [(v.shape, v.dtype) for v in self._views]:
            self._allocate(tensors)
        views = iter(self._views)
        staged = _rebuild(state, views, self._pin)
        if self._pin:
            torch.cuda.synchronize()  # the non-blocking copies are done before training changes the tensors
        return staged

    def _allocate(self, tensors: list[torch.Tensor]) -> None:
        self.close()
        offsets, ranges, total = staging_layout([t.numel() * t.element_size() for t in tensors], self.ALIGN,
                                                mmap.PAGESIZE, PIN_GROUP_BYTES)
        flat = torch.empty(total + mmap.PAGESIZE, dtype=torch.uint8)
        base = -flat.data_ptr() % mmap.PAGESIZE  # the layout's offsets count from a page boundary
        # Fault every page in here, holding neither the GIL (torch's CPU ops release it) nor the CUDA driver's lock: one
        # cudaHostRegister of 25.7 GB of fresh pages faulted them in under that lock and stalled training's CUDA calls
        # ~13.6 s on one H100 (2026-12-06). Registering them in pieces keeps each hold of the lock short.
        flat.zero_()
        self._flat = flat
        if self._pin:
            try:
                for offset, length in ranges:
                    self._register(flat.data_ptr() + base + offset, length)
            except BaseException:
                self.close()
                raise
        # Each view gets a storage of its own bytes (from_numpy of a slice), not a view of the flat storage: DCP's
        # writer clones every tensor whose storage is larger than itself (filesystem.py, _SerialCpuLoader), which
        # allocated and copied the whole state again in the writer thread (0.2 GB/s on one H100, 2026-12-06).
        flat_bytes = flat.numpy()
        self._views = [torch.from_numpy(flat_bytes[base + offset:base + offset + t.numel() * t.element_size()])
                       .view(t.dtype).view(t.shape) for offset, t in zip(offsets, tensors, strict=True)]

    def _register(self, address: int, length: int) -> None:
        code = torch.cuda.cudart().cudaHostRegister(address, length, 0)
        if int(code) != 0:
            raise RuntimeError(f"cudaHostRegister of {length / 1e6:.0f} MB for checkpoint staging failed ({code})")
        self._registered.append(address)

    def close(self) -> None:
        for address in self._registered:
            torch.cuda.cudart().cudaHostUnregister(address)
        self._flat, self._views, self._registered = None, [], []


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _collect_local(state: Any, out: list[torch.Tensor]) -> None:
    """The (local shards of the) tensors of a nested state, in the order `_rebuild` visits them."""
    if isinstance(state, dict):
        for value in state.values():
            _collect_local(value, out)
    elif isinstance(state, list | tuple):
        for value in state:
            _collect_local(value, out)
    elif isinstance(state, torch.Tensor):
        out.append(_local(state))


def _rebuild(state: Any, views: Any, non_blocking: bool) -> Any:
    """`state` with each tensor copied into the next of `views` (a DTensor re-wrapped with its spec)."""
    if isinstance(state, dict):
        return {key: _rebuild(value, views, non_blocking) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_rebuild(value, views, non_blocking) for value in state)
    if not isinstance(state, torch.Tensor):
        return state  # ints, floats, strings: immutable
    view = next(views)
    view.copy_(_local(state).detach(), non_blocking=non_blocking)
    if isinstance(state, DTensor):
        return DTensor(view, state._spec, requires_grad=False)
    return view


def available_ram_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), else free pages."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class SnapshotWriter:
    """Stages state dicts to CPU memory and writes them with DCP in one background thread.

    At most one write in flight: `stage` is refused while one runs (the cached CPU buffers it would
    overwrite are the ones being written). Every method is called on every rank at the same point."""

    def __init__(self, timeout: timedelta | None):
        on_gpu = torch.cuda.is_available()
        self._stager = CpuStager(pin=on_gpu)
        distributed = dist.is_available() and dist.is_initialized()
        self._group = dist.new_group(backend="gloo", timeout=timeout) if distributed else None
        self._future: Future | None = None

    @property
    def in_flight(self) -> bool:
        return self._future is not None

    def prepare(self, state_dict: dict[str, Any]) -> None:
        """Get the staging buffers for `state_dict` ready in the background (its tensors' shapes and dtypes)."""
        self._stager.prepare(state_dict)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A CPU copy of `state_dict` (its DTensors keep their placement); returns once copied."""
        if self._future is not None:
            raise RuntimeError("a checkpoint write is still in flight; wait for it before staging the next")
        return self._stager.stage(state_dict)

    def submit(self, writes: list[tuple[dict[str, Any], Path]], after: Callable[[], None]) -> None:
        """Write each staged state dict into its folder (DCP, every file fsynced), then run `after`."""
        self.submit_job(lambda: self.write_staged(writes), after)

    def write_staged(self, writes: list[tuple[dict[str, Any], Path]]) -> None:
        """`write_now` of staged CPU state (`stage`'s output) with `STAGED_WRITE_THREADS` threads."""
        self.write_now(writes, STAGED_WRITE_THREADS)

    def write_now(self, writes: list[tuple[dict[str, Any], Path]], threads: int = 1) -> None:
        """Write each state dict into its folder with DCP (`threads` files per rank, each written by a thread of its
        own), every file fsynced; returns once written. Collective (on the writer's group: the main thread calls it
        only while no job is in flight).

        Staged CPU state: `STAGED_WRITE_THREADS` (`write_staged`). Live GPU state (disk staging, during the pause):
        one, DCP's only path that overlaps the GPU-to-CPU copies (_OverlappingCpuLoader; with several threads each
        tensor is copied synchronously, and torch's source notes that its overlapping loader slowed down with
        threads)."""
        for state, folder in writes:
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True, thread_count=threads),
                     planner=DefaultSavePlanner(), process_group=self._group, no_dist=self._group is None)

    def submit_job(self, job: Callable[[], None], after: Callable[[], None]) -> None:
        """Run `job` (the write of a staged save: DCP from CPU memory, or the copy of node-local files), then
        `after`, in the background; `wait` gives its error.

        A daemon thread, not a thread pool: a run that fails while a write is in flight must exit at
        once, not wait at interpreter exit for a write whose peers may be gone (the next start removes
        what it left)."""
        future: Future = Future()

        def run() -> None:
            try:
                job()
                after()
            except BaseException as err:  # DCP's CheckpointException is a BaseException
                future.set_exception(err)
            else:
                future.set_result(None)

        self._future = future
        threading.Thread(target=run, name="checkpoint-writer", daemon=True).start()

    @staticmethod
    def every_rank(holds: bool, group: dist.ProcessGroup | None) -> bool:
        """Collective on `group`: whether `holds` is true on every rank."""
        short = 0 if holds else 1
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([short], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
            short = int(flag.item())
        return not short

    def fits_in_ram(self, nbytes: int, local_ranks: int, group: dist.ProcessGroup | None,
                    stageable: bool = True) -> bool:
        """Collective on `group`: whether every rank's state is `stageable` and every node can hold its ranks'
        copies (`nbytes` each) in RAM."""
        room = protocol.STAGING_RAM_SHARE * available_ram_bytes()
        return self.every_rank(stageable and nbytes * local_ranks <= room, group)

    def all_finished(self, group: dist.ProcessGroup | None) -> bool:
        """Collective on `group` (main thread): whether every rank's write job is over, done or failed.
        Never blocks on the write itself."""
        return self.every_rank(self._future is None or self._future.done(), group)

    def wait(self, timeout: float | None = None) -> BaseException | None:
        """Block until this rank's write job is over (at most `timeout` s: then a TimeoutError is the answer);
        its error, or None. The writer is free again."""
        future, self._future = self._future, None
        if future is None:
            return None
        try:
            return future.exception(timeout)
        except TimeoutError as err:
            return err

    def close(self) -> None:
        self._stager.close()
