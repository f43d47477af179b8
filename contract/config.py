"""The schema of train.toml: what the launcher renders and the train package reads.

Pure Python (no torch): the launcher imports it to validate `--set train.*` keys on a login node.
Field names in [train] follow transformers' TrainingArguments so users can carry their habits over.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract import protocol
from contract.schema import ConfigError, build, documented, read_utf8, require
from contract.shape import EXPERT_LORA_TARGETS, VALID_LORA_TARGETS, misspelt_arch_key
from contract.sources import DataFormat, DataSource, check_unique_names

AttnImpl = Literal["auto", "fa4", "flash_attn", "varlen", "sdpa", "eager"]
Scheduler = Literal["cosine", "linear", "constant"]
Precision = Literal["bf16", "fp16", "fp32", "auto"]
TrainPrecision = Literal["auto", "fp8"]
Fp8Recipe = Literal["tensorwise", "rowwise", "torchao-tensorwise"]
Fp8Linears = Literal["", "ours", "torchao"]  # whose float8 linear layers run; "" = none (bf16 linears)
LoraQuant = Literal["none", "nf4"]
ModelInit = Literal["full", "sharded"]
SaveStaging = Literal["auto", "memory", "disk"]  # train.async_save_staging
AUTO_LENGTH = "auto"  # train.model_max_length: the launcher's choice from the data (launcher/resolve/max_length.py)
ALL_LAYERS = "all"  # train.checkpoint_layers: every decoder layer checkpointed


def checkpointed_layers(layers: int, setting: int | str) -> list[int]:
    """train.checkpoint_layers: the decoder layers (0-based) that recompute their forward in backward: every one
    (ALL_LAYERS), or `setting` of the `layers` spread evenly over the stack (layer i when (i + 1)·n // L > i·n // L:
    the last of each run of L / n), the planner's count and the trainer's choice alike."""
    n = layers if setting == ALL_LAYERS else min(int(setting), layers)
    return [i for i in range(layers) if (i + 1) * n // layers > i * n // layers]


def fp8_linears(recipe: str, all_gather: bool) -> Fp8Linears:
    """Whose float8 linear layers train.precision = "fp8" runs: torchao's Float8Linear for rowwise,
    torchao-tensorwise and tensorwise with the float8 all-gather (which needs torchao's weight wrapper);
    ours (train/kernels/fp8_linear.py) for tensorwise. They save different tensors (launcher/plan/activations.py)."""
    return "torchao" if recipe != "tensorwise" or all_gather else "ours"


# The shipped tiny assets live in train/assets/; found by path (`contract` and `train` are sibling
# packages in a checkout and in the wheel), so the launcher can read the sample data without importing train.
SHIPPED_ASSETS = Path(__file__).resolve().parent.parent / "train" / "assets"
SHIPPED_DATA = SHIPPED_ASSETS / "sample_chat.jsonl"
SHIPPED_TOKENIZER = SHIPPED_ASSETS / "tiny-tokenizer"  # model `tiny`'s (and any model without its own)


@dataclass
class ModelSection:
    name: str = "tiny"  # preset name (informational), e.g. llama3-8b
    path: str = ""  # local dir or HF id; "" = build from `arch` with random weights (tiny)
    arch: dict[str, Any] = field(default_factory=dict)  # LlamaConfig kwargs for random init
    layer_class: str = "LlamaDecoderLayer"  # decoder layer wrapped by FSDP
    attn_implementation: AttnImpl = "auto"
    precision: Precision = "auto"  # auto: bf16 on GPUs that have it, fp16 on older GPUs, fp32 on CPU
    tokenizer: str = ""  # "" = same as path; for tiny: the shipped tokenizer
    rope_scaling: bool = True  # stretch RoPE (linear) when model_max_length > context
    # The random init of `arch` (no path): "full" = every rank builds the whole model (the same seed) and
    # sharding cuts it; "sharded" = built on the meta device, each rank draws only its FSDP2 shards, from a
    # seed per (train.seed, parameter name): the same weights at any world size (train/engine/sharded_init.py).
    init: ModelInit = "full"

    def validate(self) -> None:
        require(bool(self.path) or bool(self.arch), "model.path", "give a model path/HF id or model.arch")
        require(self.init == "full" or not self.path, "model.init",
                f"{self.init!r} draws random weights; it cannot be combined with model.path = {self.path!r}")
        if typo := misspelt_arch_key(self.arch):
            raise ConfigError(f"model.arch.{typo[0]}: unknown key (did you mean: {typo[1]}?)", f"model.arch.{typo[0]}")


@dataclass
class DataSection:
    """[data]: one source (path, format, text_field, eval_*), or several as [[data.sources]]."""

    path: str = ""  # "" = the small chat dataset shipped with the project
    format: DataFormat = "auto"
    text_field: str = "text"  # for format = "text" (loss on every token)
    eval_path: str = ""
    eval_fraction: float = 0.0  # split off this share of `path` for eval when eval_path is empty
    cache_dir: str = ""  # tokenized cache; "" = <run_dir>/cache
    allow_bad_rows: bool = False  # skip and count bad rows instead of failing with file:line
    skip_unrenderable: bool = False  # skip (and count in the plan) chat rows the template cannot render exactly
    allow_eval_overlap: bool = False  # train on rows some source also evaluates on (contract/overlap.py), knowingly
    packing: bool = True  # padding-free packing; false = padded batches (for comparison)
    tokens_per_micro_batch: int = 0  # packed budget; 0 = per_device_train_batch_size * model_max_length
    num_workers: int = 0
    sources: list[DataSource] | None = None  # [[data.sources]] (contract/sources.py); None = `path` alone

    def validate(self) -> None:
        require(0.0 <= self.eval_fraction < 1.0, "data.eval_fraction", "must be in [0, 1)")
        require(self.tokens_per_micro_batch >= 0, "data.tokens_per_micro_batch", "must be >= 0")
        require(self.num_workers >= 0, "data.num_workers", "must be >= 0")
        if self.sources is not None:
            require(bool(self.sources), "data.sources", "give at least one [[data.sources]] table")
            mixed = [key for key in ("path", "eval_path", "eval_fraction") if getattr(self, key)]
            require(not mixed, f"data.{mixed[0] if mixed else 'path'}",
                    "set per source in [[data.sources]], not next to them")
            check_unique_names(self.sources)

    def source_list(self) -> list[DataSource]:
        """Every source; a lone `path` (or the shipped sample) is one source with the section's settings."""
        if self.sources:
            return self.sources
        return [DataSource(path=self.path or str(SHIPPED_DATA), format=self.format, text_field=self.text_field,
                           eval_path=self.eval_path, eval_fraction=self.eval_fraction)]

    def key(self, index: int, name: str) -> str:
        """The dotted key of a source's setting, for error messages."""
        if self.sources:
            return f"data.sources[{index}].{name}"
        return {"path": "data.path", "eval_path": "data.eval_path"}.get(name, f"data.{name}")


@dataclass
class TrainSection:
    """[train]: every field is also a CLI flag (--learning_rate ...); its text is the flag's --help."""

    learning_rate: float = documented(2e-5, "peak learning rate of AdamW (after warmup)")
    per_device_train_batch_size: int = documented(4, "sequences per micro-batch per process "
                                                     "(packed: x model_max_length tokens)")
    gradient_accumulation_steps: int = documented(1, "micro-batches per optimizer step")
    num_train_epochs: float = documented(1.0, "passes over the training data")
    max_steps: int = documented(-1, "optimizer steps to run; > 0 overrides num_train_epochs")
    lr_scheduler_type: Scheduler = documented("cosine", "learning-rate schedule after warmup: cosine, linear, constant")
    warmup_ratio: float = documented(0.03, "share of the steps spent warming the learning rate up from 0")
    min_lr_ratio: float = documented(0.0, "floor of the schedule as a fraction of learning_rate")
    weight_decay: float = documented(0.0, "AdamW weight decay")
    adam_beta1: float = documented(0.9, "AdamW beta1")
    adam_beta2: float = documented(0.95, "AdamW beta2")
    max_grad_norm: float = documented(1.0, "clip the global gradient norm to this; 0 = no clipping")
    model_max_length: int | Literal["auto"] = documented(
        2048, "longest sequence in tokens; longer examples are cut to it (the plan and the training log count "
              "them); auto = the data's longest document, rounded up to a power of two (sft-launch resolves it "
              "before the queue: never below the model's default, at most 131072)")
    gradient_checkpointing: bool = documented(True, "recompute activations in backward (less memory, more compute)")
    checkpoint_layers: int | Literal["all"] = documented(
        ALL_LAYERS, "with gradient_checkpointing: how many decoder layers recompute their forward in backward, spread "
                    "evenly over the stack (contract.config.checkpointed_layers); the others keep what autograd saves "
                    "(more GPU memory, less recompute: the planner counts both); all = every layer. sft-launch "
                    "chooses it when it chooses the micro-batch and the key is not yours")
    save_steps: int = documented(500, "checkpoint every N optimizer steps (and on every stop request)")
    save_total_limit: int = documented(2, "keep the last K complete checkpoints")
    async_save: bool = documented(
        True, "true = periodic checkpoints of FSDP2's sharded state (full fine-tune, LoRA) are staged "
              "(train.async_save_staging) and written by a background thread while training goes on, each valid "
              "(COMPLETE) once every rank's files are on disk; DeepSpeed, FSDP1 and states the staging cannot "
              "copy (QLoRA's NF4 weights, train.fp8_all_gather) are saved synchronously, the log and the plan "
              "say why; false = training waits for every write")
    async_save_staging: SaveStaging = documented(
        "auto", "train.async_save: where a save's snapshot of the state is staged while it is written: memory (CPU "
                "RAM, pinned on GPUs), disk (each node's profile.node_local_dir, fsynced, then copied to the "
                "checkpoint directory in the background), auto = memory when every node's available RAM holds "
                "its ranks' shards, else disk")
    logging_steps: int = documented(10, "write a metrics.jsonl record every N optimizer steps")
    eval_steps: int = documented(0, "evaluate every N steps; 0 = only at the end (when there is an eval split)")
    report_to: list[str] = documented(["jsonl"], "reporters besides metrics.jsonl, which is always written (status and "
                                                "plot read it): wandb; jsonl or none add nothing")
    seed: int = documented(42, "seed of weights init, data order and dropout")
    compile: bool | Literal["auto"] = documented("auto", "torch.compile each decoder layer; auto = on CUDA GPUs")
    fused_loss: bool | Literal["fused", "liger", "chunked"] = documented(
        True, "fuse lm_head and cross-entropy: true = 'fused' on CUDA, 'chunked' elsewhere; or name one "
              "(train/kernels/loss.py); false = full logits")
    fused_mlp: bool | Literal["auto"] = documented(
        "auto", "compute SwiGLU inside the MLP's GEMMs (train/kernels/swiglu.py; quack-kernels, Hopper/Blackwell; "
                "less activation memory per layer than the stock MLP, eager or compiled: launcher/plan/activations.py "
                "counts it): auto = where it can run, true = required")
    precision: TrainPrecision = documented(
        "auto", "matmul precision of the decoder's linear layers: auto = model.precision's (bf16 on GPUs); fp8 = "
                "float8 linear layers (train.fp8_recipe says whose; FP8 GPUs: compute capability >= 8.9; full fine-tuning under FSDP2 or on "
                "one GPU; lm_head, attention and norms stay bf16)")
    fp8_recipe: Fp8Recipe = documented(
        "tensorwise", "scaling of --precision fp8: tensorwise (one scale per tensor, fastest; our own casts, "
                      "train/kernels/fp8_linear.py), torchao-tensorwise (the same recipe as torchao's Float8Linear), "
                      "or rowwise (torchao's, a scale per row: slower, and no closer to bf16 in our H100 parity runs)")
    fp8_fast_accum: bool = documented(
        False, "--precision fp8: true = the forward GEMMs accumulate in the tensor cores' reduced precision "
               "(torchao's default; 1.4% worse eval loss than bf16 in our parity runs, 0.7% faster at 8B); "
               "false = fp32 accumulation, as the backward GEMMs")
    fp8_all_gather: bool = documented(
        False, "--precision fp8, tensorwise: FSDP2 all-gathers the weights in float8 (half the bytes; each rank "
               "casts its own shard) instead of bf16; off by default: on 4 H100s at 8B no faster per step than "
               "the bf16 all-gather, with a higher peak; tensorwise then runs torchao's Float8Linear, whose weight "
               "wrapper this needs")
    cpu_object_collectives: bool = documented(
        True, "FSDP on GPUs: the process group also gets gloo for CPU tensors (cuda:nccl,cpu:gloo), so the "
              "checkpoint's planning collectives and barriers run on the CPU, not through NCCL buffers on the "
              "card (at 8B on 4 H100s near full memory, through NCCL the steps after a save fell from 50% MFU "
              "to 25-33%); false = NCCL for everything, Accelerate's own group")
    activation_offload: bool = documented(
        False, "long sequences: the activations the forward saves for backward (with gradient_checkpointing: "
               "each decoder layer's input) go to pinned CPU memory, copied on a side stream, and come back "
               "in backward (train/kernels/long_context.py; the planner counts them against the node's RAM)")
    mlp_chunk_tokens: int = documented(
        0, "long sequences: run each decoder layer's MLP over chunks of this many tokens, each checkpointed, so "
           "its intermediate is bounded by a chunk, not the sequence (one more MLP forward in backward); 0 = off")
    recompute_attention: bool = documented(
        True, "with gradient_checkpointing: true = each layer's attention forward runs again in backward with the "
              "rest of the layer; false = the attention kernel's outputs (output and log-sum-exp) are kept from the "
              "forward (train/kernels/keep_attention.py): more GPU memory (2 x heads x head_dim + 4 x heads bytes "
              "per token per layer in bf16, on the GPU even with activation_offload; the planner counts it), a "
              "quarter less attention work in the step (at 128k tokens most of the FLOPs)")
    deterministic: bool = documented(False, "GPU: deterministic kernels (a resume matches an uninterrupted run "
                                            "bitwise; slower)")
    gc_every_steps: int = documented(50, "Python's automatic garbage collection off while training, a young-"
                                         "generation collection on every rank every N steps instead (at the same "
                                         "step everywhere) and one right after each save; 0 = Python's automatic "
                                         "collection")
    router_aux_loss_coef: float | None = documented(
        None, "mixture-of-experts models: weight of the router's load-balancing loss added to the loss (transformers' "
              "own load_balancing_loss_func, per micro-batch, averaged over the step's micro-batches); unset = the "
              "model config's router_aux_loss_coef, 0 = off (the log says which)")
    profile_steps: str | None = documented(None, "'START:STOP': profile these optimizer steps on rank 0: "
                                           "top kernels and GPU time by kind in the log, a trace in "
                                           "logs/profile/; unset = off")

    def validate(self) -> None:
        require(self.learning_rate > 0, "train.learning_rate", "must be > 0")
        require(self.per_device_train_batch_size >= 1, "train.per_device_train_batch_size", "must be >= 1")
        require(self.gradient_accumulation_steps >= 1, "train.gradient_accumulation_steps", "must be >= 1")
        require(self.max_steps == -1 or self.max_steps > 0, "train.max_steps", "must be -1 or > 0")
        require(self.num_train_epochs > 0, "train.num_train_epochs", "must be > 0")
        require(0.0 <= self.warmup_ratio < 1.0, "train.warmup_ratio", "must be in [0, 1)")
        require(0.0 <= self.min_lr_ratio <= 1.0, "train.min_lr_ratio", "must be in [0, 1]")
        require(self.model_max_length == AUTO_LENGTH or self.model_max_length >= 8, "train.model_max_length",
                "must be >= 8, or auto")
        require(self.save_steps >= 1, "train.save_steps", "must be >= 1")
        require(self.save_total_limit >= 1, "train.save_total_limit", "must be >= 1")
        require(self.logging_steps >= 1, "train.logging_steps", "must be >= 1")
        require(self.gc_every_steps >= 0, "train.gc_every_steps", "must be >= 0 (0 = automatic collection)")
        require(self.eval_steps >= 0, "train.eval_steps", "must be >= 0")
        require(self.mlp_chunk_tokens >= 0, "train.mlp_chunk_tokens", "must be >= 0 (0 = off)")
        layers = self.checkpoint_layers
        require(layers == ALL_LAYERS or (isinstance(layers, int) and layers >= 1), "train.checkpoint_layers",
                f"must be >= 1, or all (got {self.checkpoint_layers!r}; no checkpointing: "
                "train.gradient_checkpointing = false)")
        for beta in ("adam_beta1", "adam_beta2"):  # what torch.optim.AdamW refuses, here before the queue
            require(0.0 <= getattr(self, beta) < 1.0, f"train.{beta}", "must be in [0, 1)")
        require(self.weight_decay >= 0, "train.weight_decay", "must be >= 0")
        require(self.router_aux_loss_coef is None or self.router_aux_loss_coef >= 0, "train.router_aux_loss_coef",
                "must be >= 0 (0 = off)")
        require(self.max_grad_norm >= 0, "train.max_grad_norm", "must be >= 0 (0 = no clipping)")
        require(0 <= self.seed < 2**32, "train.seed", "must be in [0, 2**32) (numpy's seed range)")
        steps = re.fullmatch(r"(\d+)(?::(\d+))?", self.profile_steps or "0")
        require(steps is not None, "train.profile_steps",
                f"expected 'START:STOP' (e.g. '8:10'), got {self.profile_steps!r}")
        require(steps is None or steps[2] is None or int(steps[2]) > int(steps[1]), "train.profile_steps",
                f"STOP must come after START, got {self.profile_steps!r}")
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
    # QLoRA (--qlora): "nf4" = the frozen base's target linears in 4-bit NormalFloat with double-quantized
    # block scales (torchao's NF4Tensor, train/engine/qlora.py); the adapters stay fp32, compute bf16.
    quant: LoraQuant = "none"

    def validate(self) -> None:
        require(self.r >= 1, "lora.r", "must be >= 1")
        require(self.alpha > 0, "lora.alpha", "must be > 0")
        require(0 <= self.dropout < 1, "lora.dropout", "must be in [0, 1)")
        require(bool(self.target_modules), "lora.target_modules", f"name at least one of {', '.join(VALID_LORA_TARGETS)}")
        unknown = [name for name in self.target_modules if name not in VALID_LORA_TARGETS]
        require(not unknown, "lora.target_modules",
                f"unknown module {unknown[0] if unknown else ''!r}; valid: {', '.join(VALID_LORA_TARGETS)}")
        on_parameters = [name for name in self.target_modules if name in EXPERT_LORA_TARGETS]
        # PEFT adapts the experts' 3D weights and the router's weight as parameters (target_parameters), whose
        # adapter sees no input of its own to drop out: PEFT refuses lora_dropout there.
        require(not on_parameters or self.dropout == 0, "lora.dropout",
                f"must be 0 when lora.target_modules names {on_parameters[0] if on_parameters else ''} "
                "(an adapter on a weight parameter has no input to drop out)")
        require(self.quant == "none" or not on_parameters, "lora.quant",
                f"{self.quant!r} cannot quantize {on_parameters[0] if on_parameters else ''}: torchao's NF4 wraps the "
                "2D weights of linear layers, not the experts' stacked 3D weights or the router; use lora.quant = "
                "\"none\" or drop it from lora.target_modules")
        require(self.quant == "none" or self.enabled, "lora.quant",
                f"{self.quant!r} quantizes the frozen base of a LoRA run: set lora.enabled = true (or use --qlora)")


@dataclass
class ParallelSection:
    """[parallel]: how one sequence is split across GPUs (train/kernels/context_parallel.py)."""

    # Context parallelism: each packed micro-batch (data.tokens_per_micro_batch tokens) is split across
    # `context` consecutive ranks, which read the same micro-batch (Ulysses: attention heads all-to-all).
    context: int = 1
    # Expert parallelism: the experts of every MoE layer split over `expert` ranks, tokens sent to their
    # expert's rank and back by all-to-all (train/moe/expert_parallel.py); FSDP2 shards the rest.
    expert: int = 1

    def validate(self) -> None:
        require(self.context >= 1, "parallel.context", "must be >= 1 (1 = off)")
        require(self.expert >= 1, "parallel.expert", "must be >= 1 (1 = off)")


@dataclass
class RunSection:
    dir: str = "."  # the run directory; relative paths below are inside it
    checkpoint_dir: str = protocol.CHECKPOINT_DIR
    export_dir: str = protocol.EXPORT_DIR  # "" = no export at the end (benchmarks)
    metrics_file: str = protocol.METRICS_FILE
    stop_file: str = protocol.STOP_FILE  # written by the batch shell's trap
    gpu_type: str = ""  # from the profile; used for peak FLOP/s when the device name is unknown
    # From the profile (#15): the progress watchdog's floor (no completed optimizer step for this long,
    # or longer when steps are slow: exit EXIT_HUNG; 0 = off) and the collective (process-group) timeout.
    hang_timeout_s: int = 600
    collective_timeout_s: int = 600
    # From the profile: node-local storage where train.async_save_staging = "disk" stages a save ($VARS expanded on
    # the node); "" = $SLURM_TMPDIR where the job has one, else the system's temp dir (train/persist/staging.py).
    node_local_dir: str = ""
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
    parallel: ParallelSection = field(default_factory=ParallelSection)
    run: RunSection = field(default_factory=RunSection)

    def validate(self) -> None:
        """Rules across sections."""
        require(self.model.init == "full" or self.lora.quant == "none", "model.init",
                f"{self.model.init!r} is not for QLoRA (lora.quant = {self.lora.quant!r}): its random init is "
                "already drawn module by module on every rank (train/engine/qlora.py)")
        if self.train.precision == "fp8":
            require(not self.lora.enabled, "train.precision", "fp8 trains the full weights; not with LoRA or QLoRA "
                    "(torchao's float8 linears would replace the adapted layers)")
            require(self.model.precision in ("auto", "bf16"), "train.precision",
                    f"fp8 computes everything else in bf16: model.precision must be auto or bf16, "
                    f"not {self.model.precision}")
            require(self.train.fp8_recipe != "rowwise" or not self.train.fp8_all_gather, "train.fp8_all_gather",
                    "the float8 all-gather needs train.fp8_recipe = tensorwise (rowwise scales its rows after "
                    "the all-gather)")
            require(self.train.fused_mlp is not True, "train.precision",
                    "fp8 runs the MLP's projections as float8 linears: not with train.fused_mlp = true "
                    "(quack's bf16 GEMMs)")

        require(self.parallel.context == 1 or self.data.packing, "parallel.context",
                "context parallelism splits packed rows (their cu_seqlens keep the documents apart): "
                "set data.packing = true")

    def sharded_qlora_stays_eager(self, ranks: int) -> bool:
        """train.compile = "auto" leaves QLoRA over several ranks eager. Measured on 2 H100s (BENCHMARKS.md,
        QLoRA): the compiled llama-70b layers had not finished 22 steps in 200 s, the eager ones took ~60 s;
        on one GPU compiling gave 1.53x. compile = true still compiles."""
        return self.lora.quant != "none" and self.train.compile == "auto" and ranks > 1

    def compiles_decoder_layers(self, on_cuda: bool, ranks: int) -> bool:
        """Whether the run torch.compiles its decoder layers (train.compile; "auto" = on CUDA): the model
        build applies it, the packer reads it (train/kernels/perf.py) and the planner counts what compiled
        layers keep (launcher/resolve/plan_input.py)."""
        if self.sharded_qlora_stays_eager(ranks):
            return False
        return self.train.compile is True or (self.train.compile == "auto" and on_cuda)

    @property
    def asks_for_fused_mlp(self) -> bool:
        """train.fused_mlp true or "auto", and never under FP8, whose float8 linears are the MLP's projections.
        Where the kernel can run is contract.gpus.fused_mlp_blocker's (planner) or the device's (training)."""
        return self.train.precision != "fp8" and bool(self.train.fused_mlp)

    @property
    def micro_batch_tokens(self) -> int:
        return self.data.tokens_per_micro_batch or (
            self.train.per_device_train_batch_size * self.train.model_max_length
        )


def load_train_config(path: str | Path) -> TrainConfig:
    """Read and validate train.toml. Relative run.dir is taken relative to the file's folder."""
    path = Path(path)
    try:
        data = tomllib.loads(read_utf8(path))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{path}: {err}") from None
    cfg = build(TrainConfig, data)
    if cfg.train.model_max_length == AUTO_LENGTH:  # train.toml holds what sft-launch resolved
        raise ConfigError(f"{path}: train.model_max_length = {AUTO_LENGTH!r} is resolved by sft-launch from the "
                          "data before the queue; a train.toml run without it needs a number", "train.model_max_length")
    if not Path(cfg.run.dir).is_absolute():
        cfg.run.dir = str((path.parent / cfg.run.dir).resolve())
    return cfg
