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
import tomllib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from contract import protocol
from contract.attention import AttentionFeatures, feature_blocker
from contract.config import SHIPPED_DATA, SHIPPED_TOKENIZER
from contract.datacheck import DataCheck, LocalData, check_data, check_hub, require_usable
from contract.readers import DEFAULT_SPLIT
from contract.formats import CHAT_FORMATS
from contract.schema import ConfigError, to_dict
from contract.sources import DataSource, looks_like_hub_id
from launcher import runrecord
from launcher.resolve.data_args import at_line
from launcher.resolve.datarules import check_eval_overlap, check_renders
from launcher.resolve.options import Launch
from launcher.resolve.profile import read_cluster_file
from launcher.resolve.presets import model_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
PROGRESS_MIN_BYTES = 64 << 20  # show a progress line for data files at least this large


def check_launch(launch: Launch) -> None:
    """All login-node checks of a resolved launch; the data verdicts are kept on `launch.data_checks`."""
    check_local_gpus(launch)
    launch.data_checks = check_launch_data(launch)
    launch.eval_overlap = check_eval_overlap(launch.train, launch.data_checks, launch.profile.hf_home)
    check_renders(launch)  # every chat row through the template (torch-free), before the sample mask check
    check_model(launch)
    check_tool_templates(launch)
    check_container(launch)
    check_writable(launch.run_dir)
    check_resumable(launch)
    check_shared(launch)


def _flag(key: str) -> str:
    return "--data" if key == "data.path" else key


def visible_gpus() -> tuple[int, str]:
    """(NVIDIA GPUs a process started here would see, where that count comes from), without torch: the
    device files /dev/nvidiaN (a container's own), else the driver's /proc/driver/nvidia/gpus, narrowed
    by CUDA_VISIBLE_DEVICES when it is set (CUDA stops at the first invalid entry, as at "-1")."""
    devices = [p for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit()]
    driver = Path("/proc/driver/nvidia/gpus")
    count, where = (len(devices), "/dev/nvidia*") if devices else (
        (len(list(driver.iterdir())), str(driver)) if driver.is_dir() else (0, "no NVIDIA driver"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return count, where
    entries = [entry.strip() for entry in visible.split(",")] if visible.strip() else []
    valid = next((i for i, entry in enumerate(entries) if not entry or entry.startswith("-")), len(entries))
    return min(count, valid), f"{where}, CUDA_VISIBLE_DEVICES={visible!r}"


def check_local_gpus(launch: Launch) -> None:
    """--executor local runs here: a GPU profile needs its GPUs on this machine (else accelerate would start
    that many CPU processes while the plan speaks of GPUs)."""
    wanted = launch.profile.gpus_per_node
    if launch.executor != "local" or wanted == 0:
        return
    have, where = visible_gpus()
    if have < wanted:
        cpu = ", ".join(f"--profile {name}" for name in _cpu_profiles(launch.cluster_file)) \
            or "e.g. --profile cpu of cluster.example.toml"
        gpus = f"{wanted} GPU{'s' if wanted > 1 else ''} ({launch.profile.gpu_type or 'gpus_per_node'})"
        raise ConfigError(f"--executor local: profile {launch.profile_name} wants {gpus} but this machine shows "
                          f"{have} ({where}); use a CPU profile (gpus_per_node = 0: {cpu}) or run where the GPUs are",
                          "gpus_per_node")


def _cpu_profiles(cluster_file: str | None) -> list[str]:
    """The cluster file's profiles with gpus_per_node = 0 (none without a file)."""
    if cluster_file is None:
        return []
    profiles = read_cluster_file(Path(cluster_file)).profiles
    return [name for name, table in profiles.items() if isinstance(table, dict) and table.get("gpus_per_node") == 0]


def check_launch_data(launch: Launch) -> list[DataCheck]:
    """Every row of every source (and of each source's own eval data) through the training side's parser;
    a mistake in a `--data FILE.toml` is named FILE:LINE."""
    try:
        return _check_sources(launch)
    except ConfigError as err:
        raise (at_line(err, launch.data_file) if launch.data_file and (err.key or "").startswith("data.")
               else err) from None


def _check_sources(launch: Launch) -> list[DataCheck]:
    data = launch.train.data
    checks = []
    for index, source in enumerate(data.source_list()):
        path_key = data.key(index, "path")
        # (data, split, the key its errors name, the key naming its path, eval?)
        wanted = [(source.path, source.split, data.key(index, "split") if source.split != DEFAULT_SPLIT else path_key,
                   path_key, False)]
        if source.eval_path:
            eval_key = data.key(index, "eval_path")
            wanted.append((source.eval_path, DEFAULT_SPLIT, eval_key, eval_key, True))
        elif source.eval_split:
            wanted.append((source.path, source.eval_split, data.key(index, "eval_split"), path_key, True))
        for value, split, key, named_by, is_eval in wanted:
            check = _check_source_data(launch, source, value, split, key, beside=bool(is_eval and source.eval_split))
            require_usable(check, data.allow_bad_rows, key)
            check.name, check.eval, check.key = source.label, is_eval, _flag(named_by)
            checks.append(check)
    return checks


def _check_source_data(launch: Launch, source: DataSource, value: str, split: str, key: str,
                       beside: bool = False) -> DataCheck:
    """A local file / folder (cached verdict), else a hub id read from the profile's HF cache."""
    path = Path(value).expanduser()
    if not path.exists():
        if not looks_like_hub_id(value):
            raise ConfigError(f"{_flag(key)} {value}: no such file or directory", key)
        return check_hub(value, source.config, split, launch.profile.hf_home, _flag(key), source.format,
                         source.text_field, source.mapping)
    path = path.resolve()
    progress = _progress_printer(path)
    check = check_data(LocalData(path, split, key, beside), source.format, source.text_field, progress,
                       source.mapping)
    if progress is not None and not check.cached:
        print(file=sys.stderr)  # end the progress line
    return check


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
    check_attention_features(launch)
    tokenizer_dir = _local_dir(model.tokenizer or model.path) or _cached_dir(launch)
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
    check_masking(tokenizer_dir, key, mask_samples(launch))


def check_tool_templates(launch: Launch) -> None:
    """Chat data with tool calls and a tokenizer `check_model` did not look at (the shipped one of model
    `tiny`, or an HF id's in profile.hf_home's cache): can its template render them?"""
    model = launch.train.model
    source = model.tokenizer or model.path
    if not any(check.tool_rows for check in launch.data_checks) or _local_dir(source) is not None \
            or _cached_dir(launch) is not None:
        return  # no tool calls, or a local tokenizer or cached snapshot: check_model rendered them
    tokenizer_dir = SHIPPED_TOKENIZER if not source else \
        model_dir(source, launch.profile.hf_home) if launch.profile.hf_home else None
    if tokenizer_dir is not None:
        check_masking(tokenizer_dir, "model.tokenizer" if model.tokenizer or not source else "model.path",
                      mask_samples(launch))


def mask_samples(launch: Launch) -> list[dict]:
    """What `python -m train.dataset.maskcheck` reads: each chat source's data, format and mapping."""
    sources = {source.label: source for source in launch.train.data.source_list()}
    samples = []
    for check in launch.data_checks:
        if check.format not in CHAT_FORMATS or check.eval:
            continue
        source = sources[check.name]
        samples.append({"path": check.path, "format": check.format, "text_field": source.text_field,
                        "split": source.split, "config": source.config, "hf_home": launch.profile.hf_home,
                        "mapping": asdict(source.mapping), "tool_row": check.first_tool_row,
                        "skip_unrenderable": launch.train.data.skip_unrenderable})
    return samples


def check_masking(tokenizer_dir: Path, key: str, samples: list[dict]) -> None:
    """The training code masks a sample conversation of every chat source with this tokenizer, and
    renders their tool calls. In a subprocess: transformers imports torch (seconds), which this process
    never does; without transformers here, not checked."""
    result = subprocess.run([sys.executable, "-m", "train.dataset.maskcheck", str(tokenizer_dir), json.dumps(samples)],
                            capture_output=True, text=True, check=False)
    if result.returncode == protocol.EXIT_USAGE:
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
    if model_dir(model_id, hf_home) is None:
        raise ConfigError(f"model.path {model_id}: not in profile.hf_home's cache ({hub}); the compute nodes load "
                          f"local files only: HF_HOME={hf_home} huggingface-cli download {model_id}", "model.path")


def check_attention_features(launch: Launch) -> None:
    """The attention backend asked for computes the model's sliding windows and attention sinks
    (contract/attention.py, the rule train applies at model build), read from its config.json (or the
    random init's model.arch); a config not here yet is checked on the nodes."""
    model = launch.train.model
    directory = model_dir(model.path, launch.profile.hf_home) if model.path else None
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8")) if directory else model.arch
    except (OSError, ValueError):
        return
    length = launch.train.train.model_max_length
    features = AttentionFeatures.from_config(config or {}, length if isinstance(length, int) else None)
    if blocker := feature_blocker(model.attn_implementation, features):
        raise ConfigError(f"model.attn_implementation: {blocker}", "model.attn_implementation")


def _cached_dir(launch: Launch) -> Path | None:
    """The cached hub snapshot model.tokenizer (else model.path) names in profile.hf_home's cache; None: a
    local folder, no HF id, or not cached here."""
    model = launch.train.model
    value = model.tokenizer or model.path
    if not value or _local_dir(value) is not None or not launch.profile.hf_home:
        return None
    return model_dir(value, launch.profile.hf_home)


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


def read_run_record(run_dir: Path) -> dict[str, Any]:
    """RUN/run.json ({} when there is none); one that is not JSON is a ConfigError naming its line."""
    path = run_dir / protocol.RUN_RECORD
    try:
        return runrecord.read(path)
    except NotADirectoryError:
        return {}
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}:{err.lineno}: not valid JSON ({err.msg}); mend or remove it", "--output") from None


def check_writable(run_dir: Path) -> None:
    """The run directory (or its nearest existing parent) must be a writable directory; an existing one a run
    directory (run.json or train.toml) or empty: a launch writes, and removes, its own files there."""
    where = "(--output, else profile.storage_root)"
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir}: exists and is not a directory {where}", "--output")
    try:
        foreign = run_dir.is_dir() and not protocol.is_run_dir(run_dir) and any(run_dir.iterdir())
    except OSError as err:
        raise ConfigError(f"run directory {run_dir}: cannot list it ({err.strerror}) {where}", "--output") from None
    read_run_record(run_dir)  # a broken run.json: one line now, not a traceback from whatever reads it next
    if foreign:
        raise ConfigError(f"run directory {run_dir}: not a run directory (no run.json or train.toml) and not empty: "
                          f"a launch would write and replace files there; choose a new or empty one {where}",
                          "--output")
    existing = run_dir
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"run directory {run_dir}: {existing} is not writable {where}", "--output")


# What a checkpoint's tensors depend on: a resume with other values fails loading it, on the nodes.
RESUME_KEYS = {"model": ("path",), "model.arch": ("vocab_size", "hidden_size", "intermediate_size",
                                                         "num_hidden_layers", "num_attention_heads",
                                                         "num_key_value_heads", "head_dim", "tie_word_embeddings"),
               "lora": ("enabled", "r", "target_modules", "quant")}


def _resume_values(train: dict[str, Any], strategy: Any) -> dict[str, Any]:
    """The RESUME_KEYS of a train.toml (as a dict) by dotted name, and the strategy; a key not set is left out."""
    tables = {"model": train.get("model", {}), "model.arch": train.get("model", {}).get("arch", {}),
              "lora": train.get("lora", {})}
    values = {f"{table}.{key}": tables[table][key] for table, keys in RESUME_KEYS.items() for key in keys
              if key in tables[table]}
    return values | ({"--strategy": strategy} if strategy else {})


def check_resumable(launch: Launch) -> None:
    """A run directory with a complete checkpoint is resumed from it: its weights (model, architecture, LoRA)
    and its layout (strategy) must be those the checkpoint was written with (the run's train.toml, run.json)."""
    run_dir = launch.run_dir
    checkpoints = run_dir / launch.train.run.checkpoint_dir
    if not any(checkpoints.glob(f"{protocol.CHECKPOINT_PREFIX}*/{protocol.CHECKPOINT_MARKER}")):
        return
    try:
        train = tomllib.loads((run_dir / protocol.TRAIN_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # nothing to compare with
    before = _resume_values(train, read_run_record(run_dir).get("strategy"))
    now = _resume_values(to_dict(launch.train), launch.strategy)
    for key, old in before.items():
        if key in now and now[key] != old:
            raise ConfigError(f"--output {run_dir}: its checkpoints were trained with {key} = {old!r}, this launch "
                              f"has {now[key]!r}: a resume could not load them; choose another --output (or move "
                              f"{checkpoints} away to start over)", key)


def node_paths(launch: Launch) -> dict[str, Path]:
    """What the compute nodes read or write, by the flag or key that named it."""
    model, data = launch.train.model, launch.train.data
    paths = {check.key: Path(check.path) for check in launch.data_checks
             if Path(check.path) != SHIPPED_DATA and Path(check.path).is_absolute()}  # hub ids: the HF cache
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
