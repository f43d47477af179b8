"""TRL's SFTTrainer (bench/peers/peer_trl.py) under `accelerate launch` with FSDP2 on the GPUs of one host, as a
user starts it: the accelerate config, and the launch under a wall-clock limit (run_logged: a time-out
kills the whole process tree). Used by bench/multi/gpu_multi_lora.py (LoRA) and bench/multi/multi_full.py (full
fine-tune, which may fall back to gradient checkpointing when the run does not fit the GPUs)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common.processes import TIMED_OUT, run_logged
from contract.protocol import free_port

# What an out-of-memory failure of a CUDA rank prints (torch.OutOfMemoryError's message).
OOM_MARKERS = ("torch.OutOfMemoryError", "CUDA out of memory")
MIN_ATTEMPT_S = 30  # a fall-back attempt with less time left than this is not started


def accelerate_yaml(run_dir: Path, processes: int, precision: str, ram_efficient_loading: bool = True) -> Path:
    """FSDP2 as templates/accelerate.yaml.j2 renders it for one node, for a peer that is no `python -m
    train` (`ram_efficient_loading` off for one that builds its model on the GPU). Our runs use the
    launcher's own rendering."""
    path = run_dir / "accelerate.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nuse_cpu: false\nnum_machines: 1\n"
        f"num_processes: {processes}\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\n"
        f"main_process_port: {free_port()}\nmixed_precision: '{precision}'\nrdzv_backend: static\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
        "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
        "  fsdp_reshard_after_forward: true\n"
        f"  fsdp_cpu_ram_efficient_loading: {str(ram_efficient_loading).lower()}\n")
    return path


def launch_peer(run: Path, gpus: int, peer_args: list[str], timeout: float, name: str = "peer") -> tuple[int, Path, Path]:
    """`accelerate launch` (FSDP2, bf16 mixed precision over the peer's own weights) of bench.peers.peer_trl;
    returns (exit code or TIMED_OUT, stdout file, stderr file)."""
    run.mkdir(parents=True, exist_ok=True)
    config = accelerate_yaml(run, gpus, "bf16", ram_efficient_loading=False)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "-m", "bench.peers.peer_trl",
               *peer_args, "--out", str(run)]
    out, err = run / f"{name}.out", run / f"{name}.err"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "8")}
    return run_logged(command, out, timeout, env, errors=err), out, err


def oom_line(*logs: Path) -> str | None:
    """The first out-of-memory line of the logs, None when the failure was something else."""
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if any(marker in line for marker in OOM_MARKERS):
                return line.strip()[:300]
    return None


def run_peer(run: Path, gpus: int, peer_args: list[str], timeout: float,
             checkpointing_fallback: bool = False, checkpointing: bool = False) -> dict[str, Any] | str:
    """The peer's JSON line (its clock, bench/peers/peer_clock.py) with `gradient_checkpointing` saying how it
    ran, or an error string. With `checkpointing_fallback`, a run that fails for lack of GPU memory is
    started again with gradient checkpointing inside the same `timeout` (`fallback_reason` says why);
    with `checkpointing`, the one run has it from the start."""
    deadline = time.monotonic() + timeout
    result, oom = _attempt(run, gpus, peer_args, deadline, checkpointing=checkpointing)
    if oom is None or checkpointing or not checkpointing_fallback:
        return result
    reason = f"out of GPU memory without gradient checkpointing: {oom}"
    print(f"peer: {reason}; starting again with gradient checkpointing", flush=True)
    if deadline - time.monotonic() < MIN_ATTEMPT_S:
        return f"no time left for the run with gradient checkpointing ({reason})"
    result, _ = _attempt(run, gpus, peer_args, deadline, checkpointing=True)
    return {**result, "fallback_reason": reason} if isinstance(result, dict) else f"{result} ({reason})"


def _attempt(run: Path, gpus: int, peer_args: list[str], deadline: float,
             checkpointing: bool) -> tuple[dict[str, Any] | str, str | None]:
    """One launch until `deadline`: (its JSON line, None), or (an error string, the out-of-memory line
    when that is why it failed)."""
    limit = deadline - time.monotonic()
    code, out, err = launch_peer(run, gpus, peer_args + ["--gradient-checkpointing"] * checkpointing, limit,
                                 "peer-ckpt" if checkpointing else "peer")
    if code == 0:
        return {**json.loads(out.read_text().strip().splitlines()[-1]), "gradient_checkpointing": checkpointing}, None
    if code == TIMED_OUT:
        return f"timeout {limit:.0f} s", None
    print(out.read_text()[-2000:], err.read_text()[-4000:])
    oom = oom_line(err, out)
    return f"exit {code}" + (f": {oom}" if oom else ""), oom
