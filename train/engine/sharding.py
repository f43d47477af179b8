"""The Accelerator of a training process, sharded with FSDP2 on CPU hosts as on GPU ones.

``accelerate launch`` with an FSDP config exports ``ACCELERATE_USE_FSDP`` and the ``FSDP_*``
settings, and ``Accelerator()`` builds its FSDP plugin from them on every host. On GPUs the
state then becomes ``DistributedType.FSDP``; with ``cpu=True`` (no GPU) Accelerate 1.15 keeps
``MULTI_CPU`` and would wrap the model in DDP, because it turns FSDP on only for GPU-like
distributed types. torch's ``fully_shard`` itself runs on CPU over gloo (gloo has
``all_gather_into_tensor`` and ``reduce_scatter_tensor``), so on CPU we switch the state to FSDP
with the same plugin: from there ``prepare`` (``fully_shard`` per decoder layer, rank-0 weights
broadcast by ``cpu_ram_efficient_loading``), ``save_state``/``load_state`` (sharded DCP) and
``get_state_dict`` (full state dict for the export) are Accelerate's FSDP2 code, as on GPU.

FSDP1 cannot take this path: its rank-0 weight broadcast (``sync_module_states``, forced by
``cpu_ram_efficient_loading``) is GPU-only in torch, and Accelerate's FSDP1 plugin asks for a GPU
when ``Accelerator()`` builds it; the launcher refuses it on CPU profiles
(``launcher.resolve.options.check_combinations``).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from contract.protocol import EXIT_OK, EXIT_REQUEUE
from train.engine.model import mixed_precision

logger = logging.getLogger(__name__)


# FSDP on GPUs with train.cpu_object_collectives (the default): object collectives (DCP's gather/scatter of the
# save and load plans, barriers) pick the CPU backend of a group that has one (torch's _get_object_coll_device).
# Through NCCL they need point-to-point buffers that NCCL allocates on the card at their first use, the first
# save: at 8B with 10,240 tokens per GPU on 4 H100s that failed on a card the allocator had filled, and once the
# allocator had given its cache back, the steps after the save ran into allocator retries at 25-33% MFU (sixth
# session); over gloo they stayed at 47.7-50.0% without a retry (BENCHMARKS.md, seventh session).
CPU_OBJECT_BACKEND = "cuda:nccl,cpu:gloo"  # as Accelerate itself creates it for FSDP with CPU offload


def build_accelerator(precision: str, collective_timeout_s: int | None = None,
                      cpu_object_collectives: bool = False) -> Accelerator:
    """The Accelerator for this process: FSDP2 (GPU or CPU/gloo), DeepSpeed or DDP as launched.
    With `collective_timeout_s`, a collective that waits longer gives up (train/main.py: exit 76);
    with `cpu_object_collectives`, an FSDP job on GPUs adds gloo to its process group (CPU_OBJECT_BACKEND)."""
    on_cpu = not torch.cuda.is_available()
    backend = process_group_backend(cpu_object_collectives, on_cpu, _launched_with_fsdp())
    if collective_timeout_s or backend:
        init_process_group(on_cpu, collective_timeout_s, backend)
    accelerator = Accelerator(cpu=on_cpu, mixed_precision=mixed_precision(precision))
    if on_cpu and accelerator.distributed_type == DistributedType.MULTI_CPU and _launched_with_fsdp():
        shard_on_cpu(accelerator)
    return accelerator


def process_group_backend(cpu_object_collectives: bool, on_cpu: bool, fsdp: bool) -> str | None:
    """CPU_OBJECT_BACKEND for an FSDP job on GPUs that asks for it; None (Accelerate's choice) otherwise:
    on CPU the group is gloo already, and DeepSpeed builds its own from one backend name."""
    return CPU_OBJECT_BACKEND if cpu_object_collectives and fsdp and not on_cpu else None


def init_process_group(on_cpu: bool, timeout_s: int | None, backend: str | None = None) -> None:
    """Create the process group (this timeout, this backend; None: torch's and Accelerate's defaults)
    before Accelerator() does (it then reuses it).

    Not through ``Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=...)])``: Accelerate
    1.15's ``to_kwargs`` keeps only the values that differ from the class defaults (backend nccl,
    600 s), so a 600 s timeout would be dropped and gloo would wait torch's default 30 minutes.
    ``PartialState(**kwargs)`` is the documented way to pass ``init_process_group`` arguments.
    """
    # A timed-out NCCL collective cannot be unwound from Python: torch's NCCL watchdog tears the process
    # down (3 = without the cleanup abort that can itself hang; torch's default since 2.2, pinned here).
    # Our progress watchdog (train/engine/watchdog.py) fires first when the hang bound is below this timeout,
    # and writes the record and stack dump that a torn-down process cannot. The NCCL heartbeat monitor
    # (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) watches torch's own watchdog thread, not peers: left as is.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    options: dict[str, object] = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend:
        options["backend"] = backend
    PartialState(cpu=on_cpu, **options)


def _launched_with_fsdp() -> bool:
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def shard_on_cpu(accelerator: Accelerator) -> None:
    """Turn a MULTI_CPU (gloo) state into FSDP2 with the launch's FSDP plugin (see the module doc)."""
    plugin = FullyShardedDataParallelPlugin()  # reads the FSDP_* variables, as Accelerator() does
    if plugin.fsdp_version != 2:
        raise RuntimeError(f"FSDP version {plugin.fsdp_version} cannot run on CPU; use FSDP2 (strategy fsdp)")
    state = accelerator.state
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    # As AcceleratorState does on GPU: every later AcceleratorState() copies PartialState's type.
    PartialState().distributed_type = DistributedType.FSDP
    logger.info("CPU host: sharding with FSDP2 over %s (%d ranks)", state.backend, accelerator.num_processes)


def release_process_group(accelerator: Accelerator, code: int) -> int:
    """After a run that ended as planned (done, or stopped and saved: `code` 0 or 75), every rank meets
    once more and destroys the process group before Python exits; returns `code`.

    Why: left to the interpreter's exit, gloo's worker threads can still hold work whose tensors need the
    GIL of a half torn-down interpreter, and the rank aborts (SIGABRT, "terminate called without an active
    exception") after a run that succeeded: a finished 2-rank ZeRO-3 run on CPU did, once, in CI
    (pytorch/pytorch#179291 describes the crash). A rank that failed skips this, as torchtitan does: the
    others may be inside a collective that would never finish.
    """
    if code in (EXIT_OK, EXIT_REQUEUE) and torch.distributed.is_initialized():
        accelerator.wait_for_everyone()
        torch.distributed.destroy_process_group()
    return code
