"""Helpers for the multi-process training tests: a run directory (train.toml + accelerate.yaml)
and the real ``accelerate launch`` CLI, which starts a 2-rank gloo world through torchrun on CPU."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from contract.protocol import free_port
from tests.faults import FOLDER as FAULTS
from tests.train.conftest import TINY_ARCH

REPO = Path(__file__).resolve().parents[2]

BASE_CONFIG: dict[str, dict[str, Any]] = {
    "model": {"arch": TINY_ARCH, "attn_implementation": "sdpa"},
    "data": {"tokens_per_micro_batch": 256},
    "train": {"learning_rate": 3e-3, "max_steps": 30, "warmup_ratio": 0.1, "gradient_accumulation_steps": 2,
              "logging_steps": 5, "save_steps": 1000, "model_max_length": 256, "seed": 7,
              "gradient_checkpointing": True, "async_save": True},  # the training tests save asynchronously
    "run": {"dir": "."},
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)  # numbers and basic strings are valid TOML as JSON


def write_run(run_dir: Path, overrides: dict[str, dict[str, Any]] | None = None, processes: int = 2) -> Path:
    """Create run_dir with train.toml (BASE_CONFIG + overrides per section) and accelerate.yaml."""
    run_dir.mkdir(parents=True, exist_ok=True)
    sections = {name: dict(values) for name, values in BASE_CONFIG.items()}
    for name, values in (overrides or {}).items():
        sections.setdefault(name, {}).update(values)
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    (run_dir / "train.toml").write_text("\n".join(lines) + "\n")
    (run_dir / "accelerate.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nuse_cpu: false\nnum_machines: 1\n"
        f"num_processes: {processes}\nmachine_rank: 0\nmain_process_ip: 127.0.0.1\n"
        f"main_process_port: {free_port()}\nmixed_precision: 'no'\nrdzv_backend: static\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
        "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
        "  fsdp_reshard_after_forward: true\n  fsdp_cpu_ram_efficient_loading: true\n"  # as rendered
    )
    return run_dir


def launch_command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(run_dir / "accelerate.yaml"),
            "-m", "train", "--config", str(run_dir / "train.toml")]


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The workers' environment; tests/faults first on PYTHONPATH, so fault variables in `extra` take effect."""
    pythonpath = os.pathsep.join(filter(None, [str(FAULTS), str(REPO), os.environ.get("PYTHONPATH", "")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.update(extra or {})
    return env


def run_worker(worker: Path, run_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """A worker script (tests/train/workers/) on run_dir's processes, started as the launcher starts training."""
    return subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           str(run_dir / "accelerate.yaml"), str(worker), str(run_dir)],
                          cwd=REPO, env=launch_env(), capture_output=True, text=True, timeout=timeout)


def run_training(run_dir: Path, extra_env: dict[str, str] | None = None, timeout: float = 240,
                 log_name: str = "train.log") -> int:
    """Run to completion; the combined output goes to run_dir/log_name (printed on failure by callers)."""
    with open(run_dir / log_name, "w") as log:
        proc = subprocess.run(launch_command(run_dir), cwd=REPO, env=launch_env(extra_env), stdout=log,
                              stderr=subprocess.STDOUT, timeout=timeout)
    return proc.returncode


def read_log(run_dir: Path, log_name: str = "train.log") -> str:
    return (run_dir / log_name).read_text(errors="replace")


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def exported_tensors(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted((run_dir / "export").glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def assert_sharded_checkpoint(checkpoint: Path, world: int) -> None:
    """The checkpoint has FSDP2's sharded layout (torch.distributed.checkpoint: ``.distcp`` files of
    every rank for the model and for the optimizer, ``__<rank>_<i>``: one per rank from Accelerate's
    save, several from an asynchronous save's threads; each weight split across the ranks), not DDP's
    single model file: a silent fall-back to DDP fails here."""
    from accelerate.utils.constants import FSDP_MODEL_NAME, OPTIMIZER_NAME
    from torch.distributed.checkpoint import FileSystemReader

    full_files = [p.name for p in checkpoint.iterdir() if p.suffix in (".safetensors", ".bin")]
    assert not full_files, f"{checkpoint}: unsharded model files {full_files} (DDP layout)"
    for name in (f"{FSDP_MODEL_NAME}_0", f"{OPTIMIZER_NAME}_0"):
        shards = checkpoint / name
        files = [re.fullmatch(r"__(\d+)_\d+\.distcp", p.name) for p in shards.glob("*.distcp")]
        assert all(files) and {int(f.group(1)) for f in files} == set(range(world)), (shards, files)
        tensors = FileSystemReader(str(shards)).read_metadata().state_dict_metadata
        matrices = {key: meta for key, meta in tensors.items() if len(getattr(meta, "size", ())) == 2}
        assert matrices, f"{shards}: no weight matrices in the DCP metadata"
        for key, meta in matrices.items():
            rows = sorted(chunk.offsets[0] for chunk in meta.chunks)
            assert len(rows) == world and len(set(rows)) == world, f"{shards}: {key} is not split over {world} ranks"


def full_model_state(checkpoint: Path) -> dict:
    """The whole model state of a sharded (FSDP2, DCP) checkpoint, gathered into one dict on this
    process (offline: torch.distributed.checkpoint's DCP -> torch.save converter)."""
    import tempfile

    import torch
    from accelerate.utils.constants import FSDP_MODEL_NAME
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "model.pt"
        dcp_to_torch_save(str(checkpoint / f"{FSDP_MODEL_NAME}_0"), str(target))
        state = torch.load(target, weights_only=True)
    return state.get("model", state)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL the whole job, as a dead node would: the launcher and every process below it (torchrun
    starts each worker in a session of its own, so killing the launcher's process group leaves them)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        victims = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for victim in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()
    proc.wait()
