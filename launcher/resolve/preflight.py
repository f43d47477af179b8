"""Everything checkable on the login node, checked before a run directory is written or a job queued.

A job may wait hours for its nodes; a mistake found then costs those hours. So, after the options
resolve: every data row (contract.datacheck, the same parser train uses), the model (a local directory's
config, tokenizer and chat template, which must mask a sample; an HF id in profile.hf_home's cache),
the container image file, the run directory's writability and, with profile.shared_paths, that the
nodes can see it all. Each failure is a ConfigError (exit 2) naming the flag, key or file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from contract.config import SHIPPED_DATA
from contract.datacheck import DataCheck, check_data, require_usable
from contract.schema import ConfigError
from launcher.resolve.options import Launch

CHAT_FORMATS = ("sharegpt", "messages", "alpaca")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
PROGRESS_MIN_BYTES = 64 << 20  # show a progress line for data files at least this large


def check_launch(launch: Launch) -> None:
    """All login-node checks of a resolved launch; the data verdicts are kept on `launch.data_checks`."""
    launch.data_checks = check_launch_data(launch)
    check_model(launch)
    check_container(launch)
    check_writable(launch.run_dir)
    check_shared(launch)


def _data_path(launch: Launch, value: str, key: str) -> Path:
    """data.path as the options resolved it (absolute), data.eval_path as given (relative to here)."""
    if not value:
        return SHIPPED_DATA
    path = Path(value).expanduser()
    if path.exists():
        return path.resolve()
    flag = "--data" if key == "data.path" else key
    raise ConfigError(f"{flag} {value}: no such file or directory (a hub dataset id is not read on the "
                      "compute nodes: save it with datasets' save_to_disk on shared storage and pass that folder)",
                      key)


def check_launch_data(launch: Launch) -> list[DataCheck]:
    data = launch.train.data
    checks = []
    for key, value in (("data.path", data.path), ("data.eval_path", data.eval_path)):
        if key == "data.eval_path" and not value:
            continue
        path = _data_path(launch, value, key)
        progress = _progress_printer(path)
        check = check_data(path, data.format, data.text_field, progress)
        if progress is not None and not check.cached:
            print(file=sys.stderr)  # end the progress line
        require_usable(check, data.allow_bad_rows, key)
        checks.append(check)
    return checks


def _progress_printer(path: Path):  # type: ignore[no-untyped-def]
    """A progress line on an interactive stderr for large files; None otherwise."""
    if not sys.stderr.isatty() or path.is_dir() or path.stat().st_size < PROGRESS_MIN_BYTES:
        return None
    started = time.monotonic()

    def show(done: int, total: int) -> None:
        rate = done / max(time.monotonic() - started, 1e-3) / 1e6
        print(f"\rsft-launch: checking {path.name}: {done / 1e9:.2f} / {total / 1e9:.2f} GB "
              f"({100 * done // max(total, 1)}%, {rate:,.0f} MB/s)", end="", file=sys.stderr, flush=True)

    return show


def is_chat_data(checks: list[DataCheck]) -> bool:
    return any(check.format in CHAT_FORMATS for check in checks)


def check_model(launch: Launch) -> None:
    """A local model directory has a config, a tokenizer and (for chat data) a chat template."""
    model = launch.train.model
    for key, value in (("model.path", model.path), ("model.tokenizer", model.tokenizer)):
        if not value or (not value.startswith(("/", ".", "~")) and not Path(value).expanduser().is_dir()):
            continue  # a preset's HF id or empty: nothing local to look at
        directory = Path(value).expanduser()
        if not directory.is_dir():
            raise ConfigError(f"{key}: {value}: no such directory", key)
        if key == "model.path" and not (directory / "config.json").is_file():
            raise ConfigError(f"{key}: {directory}/config.json missing (not a Hugging Face model directory)", key)
    check_hub_model(launch)
    tokenizer_dir = _local_dir(model.tokenizer or model.path)
    if tokenizer_dir is None:
        return
    key = "model.tokenizer" if model.tokenizer else "model.path"
    if not any((tokenizer_dir / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{key}: {tokenizer_dir} has no tokenizer ({', '.join(TOKENIZER_FILES)}); "
                          "set model.tokenizer to a directory that has one", key)
    if not is_chat_data(launch.data_checks):
        return
    if not has_chat_template(tokenizer_dir):
        raise ConfigError(f"{key}: the tokenizer in {tokenizer_dir} has no chat template, but the data is "
                          "chat (use an instruct model's tokenizer via model.tokenizer, or data.format = \"text\")", key)
    check_masking(tokenizer_dir, key, launch.data_checks[0])


def check_masking(tokenizer_dir: Path, key: str, data: DataCheck) -> None:
    """The training code masks a sample conversation with this tokenizer. In a subprocess: transformers
    imports torch (seconds), which this process never does; without transformers here, not checked."""
    result = subprocess.run([sys.executable, "-m", "train.dataset.maskcheck", str(tokenizer_dir), data.path, data.format],
                            capture_output=True, text=True, check=False)
    if result.returncode == 2:
        reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "mask check failed"
        raise ConfigError(f"{key}: {tokenizer_dir}: {reason}", key)


def check_hub_model(launch: Launch) -> None:
    """A Hugging Face id must be in the profile's shared HF cache: train loads local files only.
    Checked when profile.hf_home is visible from here (otherwise nothing to look at)."""
    model_id, hf_home = launch.train.model.path, launch.profile.hf_home
    if not model_id or _local_dir(model_id) is not None or not hf_home:
        return
    hub = Path(hf_home).expanduser() / "hub"
    if not Path(hf_home).expanduser().is_dir():
        return
    snapshots = hub / f"models--{model_id.replace('/', '--')}" / "snapshots"
    if not any(snapshots.glob("*/config.json")):
        raise ConfigError(f"model.path {model_id}: not in profile.hf_home's cache ({hub}); the compute nodes load "
                          f"local files only: HF_HOME={hf_home} huggingface-cli download {model_id}", "model.path")


def _local_dir(value: str) -> Path | None:
    path = Path(value).expanduser() if value else None
    return path if path is not None and path.is_dir() else None


def has_chat_template(directory: Path) -> bool:
    """chat_template.jinja / .json, or a chat_template in tokenizer_config.json (transformers' places)."""
    if (directory / "chat_template.jinja").is_file() or (directory / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(config.get("chat_template"))


def check_container(launch: Launch) -> None:
    """An image given as a file (a path, .sif, .sqsh) must exist; registry references are not checked."""
    container = launch.profile.container
    image = container.image
    looks_like_file = image.startswith(("/", ".", "~")) or image.endswith((".sif", ".sqsh", ".squashfs"))
    if container.kind != "none" and looks_like_file and not Path(image).expanduser().is_file():
        raise ConfigError(f"container.image: {image}: no such file", "container.image")


def check_writable(run_dir: Path) -> None:
    """The run directory (or its nearest existing parent) must be a writable directory."""
    where = "(--output, else profile.storage_root)"
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir}: exists and is not a directory {where}", "--output")
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run directory {run_dir}: {existing} is not writable {where}", "--output")


def node_paths(launch: Launch) -> dict[str, Path]:
    """What the compute nodes read or write, by the flag or key that named it."""
    model, data = launch.train.model, launch.train.data
    paths = {key: Path(check.path) for key, check in zip(("--data", "data.eval_path"), launch.data_checks)
             if Path(check.path) != SHIPPED_DATA}
    paths |= {key: directory for key, value in (("model.path", model.path), ("model.tokenizer", model.tokenizer))
              if (directory := _local_dir(value)) is not None}
    if data.cache_dir and Path(data.cache_dir).is_absolute():
        paths["data.cache_dir"] = Path(data.cache_dir)
    if launch.profile.container.kind != "none" and Path(launch.profile.container.image).expanduser().is_file():
        paths["container.image"] = Path(launch.profile.container.image).expanduser()
    return paths | {"--output": launch.run_dir}


def check_shared(launch: Launch) -> None:
    """With profile.shared_paths set, every path the nodes need must lie under one of them."""
    roots = [Path(root).expanduser().resolve() for root in launch.profile.shared_paths]
    if not roots or launch.executor == "local":
        return
    for key, path in node_paths(launch).items():
        resolved = path.expanduser().resolve()
        if not any(resolved == root or root in resolved.parents for root in roots):
            raise ConfigError(f"{key} {resolved}: not on the nodes' shared storage (profile.shared_paths = "
                              f"{launch.profile.shared_paths}); the compute nodes cannot read it", key)
