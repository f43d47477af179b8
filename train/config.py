"""The schema of train.toml: what the launcher renders and the train package reads.

Pure Python (no torch): the launcher imports it to validate `--set train.*` keys on a login node.
Field names in [train] follow transformers' TrainingArguments so users can carry their habits over.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from launcher.schema import ConfigError, build, require

AttnImpl = Literal["auto", "fa4", "flash_attn", "varlen", "sdpa", "eager"]
DataFormat = Literal["auto", "sharegpt", "messages", "alpaca", "text", "tokens"]  # tokens: pre-tokenized input_ids
Scheduler = Literal["cosine", "linear", "constant"]
Precision = Literal["bf16", "fp16", "fp32", "auto"]

# Exit code of a training process that saved a checkpoint because it was asked to stop
# (EX_TEMPFAIL): the batch shell requeues the job when it sees it.
EXIT_REQUEUE = 75


@dataclass
class ModelSection:
    name: str = "tiny"  # preset name (informational), e.g. llama3-8b
    path: str = ""  # local dir or HF id; "" = build from `arch` with random weights (tiny)
    arch: dict[str, Any] = field(default_factory=dict)  # LlamaConfig kwargs for random init
    layer_class: str = "LlamaDecoderLayer"  # decoder layer wrapped by FSDP
    attn_implementation: AttnImpl = "auto"
    precision: Precision = "auto"  # auto: bf16 on GPUs that have it, else fp32 (CPU)
    tokenizer: str = ""  # "" = same as path; for tiny: the shipped tokenizer
    rope_scaling: bool = True  # stretch RoPE (linear) when model_max_length > context

    def validate(self) -> None:
        require(bool(self.path) or bool(self.arch), "model.path", "give a model path/HF id or model.arch")


@dataclass
class DataSection:
    path: str = ""  # "" = the small chat dataset shipped with the project
    format: DataFormat = "auto"
    text_field: str = "text"  # for format = "text" (loss on every token)
    eval_path: str = ""
    eval_fraction: float = 0.0  # split off this share of `path` for eval when eval_path is empty
    cache_dir: str = ""  # tokenized cache; "" = <run_dir>/cache
    allow_bad_rows: bool = False  # skip and count bad rows instead of failing with file:line
    packing: bool = True  # padding-free packing; false = padded batches (for comparison)
    tokens_per_micro_batch: int = 0  # packed budget; 0 = per_device_train_batch_size * model_max_length
    num_workers: int = 0

    def validate(self) -> None:
        require(0.0 <= self.eval_fraction < 1.0, "data.eval_fraction", "must be in [0, 1)")
        require(self.tokens_per_micro_batch >= 0, "data.tokens_per_micro_batch", "must be >= 0")


@dataclass
class TrainSection:
    learning_rate: float = 2e-5
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    num_train_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides num_train_epochs
    lr_scheduler_type: Scheduler = "cosine"
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.0  # floor of the schedule as a fraction of learning_rate
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    max_grad_norm: float = 1.0
    model_max_length: int = 2048
    gradient_checkpointing: bool = True
    save_steps: int = 500
    save_total_limit: int = 2  # keep the last K complete checkpoints
    logging_steps: int = 10
    eval_steps: int = 0  # 0 = eval only at the end (when there is an eval split)
    report_to: list[str] = field(default_factory=lambda: ["jsonl"])  # jsonl, wandb, none
    seed: int = 42
    compile: bool | Literal["auto"] = "auto"  # torch.compile each decoder layer; auto = on CUDA GPUs
    fused_loss: bool = True  # lm_head + cross-entropy fused (Liger on CUDA if installed, else chunked)
    deterministic: bool = False  # GPU: deterministic kernels (resume == uninterrupted, bitwise; slower)

    def validate(self) -> None:
        require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
        require(self.per_device_train_batch_size >= 1, "train.per_device_train_batch_size", "must be >= 1")
        require(self.gradient_accumulation_steps >= 1, "train.gradient_accumulation_steps", "must be >= 1")
        require(self.max_steps == -1 or self.max_steps > 0, "train.max_steps", "must be -1 or > 0")
        require(self.num_train_epochs > 0, "train.num_train_epochs", "must be > 0")
        require(0.0 <= self.warmup_ratio < 1.0, "train.warmup_ratio", "must be in [0, 1)")
        require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", "must be in [0, 1]")
        require(self.model_max_length >= 8, "train.model_max_length", "must be >= 8")
        require(self.save_steps >= 1, "train.save_steps", "must be >= 1")
        require(self.save_total_limit >= 1, "train.save_total_limit", "must be >= 1")
        require(self.logging_steps >= 1, "train.logging_steps", "must be >= 1")
        bad = set(self.report_to) - {"jsonl", "wandb", "none"}
        require(not bad, "train.report_to", f"unknown reporter(s) {sorted(bad)}; valid: jsonl, wandb, none")


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    merge_on_export: bool = False

    def validate(self) -> None:
        require(self.r >= 1, "lora.r", "must be >= 1")


@dataclass
class RunSection:
    dir: str = "."  # the run directory; relative paths below are inside it
    checkpoint_dir: str = "checkpoints"
    export_dir: str = "export"  # "" = no export at the end (benchmarks)
    metrics_file: str = "metrics.jsonl"
    stop_file: str = "STOP_REQUESTED"  # written by the batch shell's trap
    gpu_type: str = ""  # from the profile; used for peak FLOP/s when the device name is unknown
    wandb_project: str = "sft-launch"
    name: str = ""

    def resolve(self, rel: str) -> Path:
        path = Path(rel)
        return path if path.is_absolute() else Path(self.dir) / path


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    lora: LoraSection = field(default_factory=LoraSection)
    run: RunSection = field(default_factory=RunSection)

    @property
    def micro_batch_tokens(self) -> int:
        return self.data.tokens_per_micro_batch or (
            self.train.per_device_train_batch_size * self.train.model_max_length
        )


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate train.toml. Relative run.dir is taken relative to the file's folder."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from None
    cfg = build(TrainConfig, data)
    if not Path(cfg.run.dir).is_absolute():
        cfg.run.dir = str((path.parent / cfg.run.dir).resolve())
    return cfg
