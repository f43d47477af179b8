"""Speed features applied to a built model: fused lm_head + loss, torch.compile per decoder layer; and
the training loop's garbage collection at step boundaries.

Both act on one model *instance* (no class is patched) and leave parameter names untouched, so
checkpoints, FSDP wrapping and the export see the same model as without them.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import time
import types
from typing import Any

import torch
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

from contract.config import TrainConfig, TrainSection, checkpointed_layers
from train.kernels.keep_attention import checkpoint_kwargs
from train.kernels.loss import IGNORE_INDEX, linear_cross_entropy_sum, shift_labels

logger = logging.getLogger(__name__)


def _fused_forward(self: Any, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                   num_items_in_batch: torch.Tensor | int | None = None, *, loss_backend: str = "auto",
                   **kwargs: Any) -> MoeCausalLMOutputWithPast:
    """LlamaForCausalLM.forward without materialising the logits when labels are given.

    Runs inside the root module's forward, so under FSDP2 the root's parameters (embedding, final
    norm, lm_head) are unsharded here exactly as in the stock forward. Loss semantics match
    transformers' ForCausalLMLoss: sum over tokens / num_items_in_batch (or / label count), and, as there,
    `shift_labels` are targets already shifted (a context-parallel slice's: train/kernels/context_parallel.py).
    """
    kwargs.pop("logits_to_keep", None)
    shifted = kwargs.pop("shift_labels", None)
    outputs = self.model(input_ids=input_ids, **kwargs)
    hidden = outputs.last_hidden_state
    router_logits = getattr(outputs, "router_logits", None)  # MoE, asked for (train/moe/router.py adds the loss)
    if labels is None:
        return MoeCausalLMOutputWithPast(logits=self.lm_head(hidden), router_logits=router_logits)
    weight = _head_weight(self.lm_head, hidden)
    if torch.is_autocast_enabled(hidden.device.type):
        # Autocast would run the lm_head matmul in bf16/fp16; the fused kernels do not see autocast.
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    loss_sum = linear_cross_entropy_sum(hidden, weight, labels, backend=loss_backend, shifted=shifted)
    if num_items_in_batch is None:
        targets = shift_labels(labels) if shifted is None else shifted
        num_items_in_batch = (targets != IGNORE_INDEX).sum().clamp(min=1)
    return MoeCausalLMOutputWithPast(loss=loss_sum / num_items_in_batch, router_logits=router_logits)


def _head_weight(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """lm_head's full weight. Under FSDP2 Accelerate shards lm_head in a unit with the final norm,
    which the norm's forward unshards; when it finds no norm (a peft-wrapped model) lm_head is a unit
    alone, which only its own forward unshards: run that forward on zero tokens."""
    if hasattr(lm_head.weight, "full_tensor"):  # still a sharded DTensor
        lm_head(hidden[..., :0, :])
    return lm_head.weight


def use_fused_loss(model: torch.nn.Module, backend: str = "auto") -> None:
    """Make `model(**batch, labels=...)` compute the loss from hidden states (train/kernels/loss.py's backend)."""
    if not (hasattr(model, "model") and hasattr(model, "lm_head")):
        raise TypeError(f"fused loss needs a *ForCausalLM model with .model and .lm_head, got {type(model)}")
    model.forward = types.MethodType(functools.partial(_fused_forward, loss_backend=backend), model)


def gather_lm_head_with_root(model: torch.nn.Module) -> None:
    """ZeRO-3: the fused loss reads lm_head.weight outside lm_head's own forward, where DeepSpeed would
    leave it partitioned (an empty tensor). Registering it as an external parameter of the root
    module makes DeepSpeed gather it for the root's forward and backward, which enclose the loss."""
    from deepspeed.runtime.zero import register_external_parameter

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    register_external_parameter(model, base.lm_head.weight)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def enable_checkpointing(model: torch.nn.Module, train: TrainSection) -> list[int]:
    """Per-layer activation checkpointing, non-reentrant (frozen inputs under LoRA, FSDP2, keyword arguments), on
    the decoder layers train.checkpoint_layers names (contract.config.checkpointed_layers); the others keep what
    autograd saves. train.recompute_attention = false keeps the attention kernels' outputs in the checkpointed
    ones (train/kernels/keep_attention.py). transformers' layers, and our compiled ones (`_checkpointed_forward`),
    read each layer's own `gradient_checkpointing` at every call. Returns the checkpointed layers' indices."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpoint_kwargs(train.recompute_attention))
    layers = decoder_layers(model)
    chosen = checkpointed_layers(len(layers), train.checkpoint_layers)
    for index, layer in enumerate(layers):
        layer.gradient_checkpointing = index in chosen
    if len(chosen) < len(layers):
        logger.info("checkpointing %d of %d decoder layers (train.checkpoint_layers); the others keep their "
                    "activations", len(chosen), len(layers))
    return chosen


def compiles_decoder_layers(cfg: TrainConfig, num_processes: int) -> bool:
    """Whether this process torch.compiles its decoder layers (contract.config's rule, on this device).
    The model build applies it and the packer reads it: compiled layers get fixed-length packed rows
    (train/dataset/packing.py), since a new row length can recompile them mid-run."""
    return cfg.compiles_decoder_layers(torch.cuda.is_available(), num_processes)


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """torch.compile each decoder layer's computation (the repeated block; hooks and checkpointing stay
    outside the compiled region, which keeps FSDP's per-layer hooks and recompute intact)."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.forward = _compiled_forward(layer)
    logger.info("torch.compile: %d decoder layers", len(layers))
    return len(layers)


def _compiled_forward(layer: torch.nn.Module) -> Any:
    """The layer's forward with its computation compiled and per-layer checkpointing around it.

    transformers >= 5 checkpoints inside the class's `forward` (GradientCheckpointingLayer wraps it in
    `forward_with_checkpointing`), and that wrapper checkpoints only while it is the class's outermost
    `forward`. FSDP2's `fully_shard` (after this, in prepare) swaps the layer's class for a subclass whose
    `forward` is wrapped once more, so a compiled *bound* wrapper stopped checkpointing: every compiled
    decoder layer kept its whole saved set under FSDP2 (llama-70b QLoRA on one H100: out of memory in the
    first forward at 77 GiB, planned 54.6; a 4-layer 1/8-width copy on CPU kept 36.5 MiB per layer instead
    of its 2 MiB input). So the computation under that wrapper is compiled, and the layer's own flags
    decide the checkpoint at every call, whatever its class has become."""
    wrapper = type(layer).forward
    computation = getattr(wrapper, "__wrapped__", None)
    name = getattr(getattr(wrapper, "__code__", None), "co_name", "")
    if computation is None or name != "forward_with_checkpointing":
        return torch.compile(layer.forward, dynamic=True)  # checkpointing (if any) is outside `forward`
    compiled = torch.compile(types.MethodType(computation, layer), dynamic=True)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            return layer._gradient_checkpointing_func(functools.partial(compiled, **kwargs), *args)
        return compiled(*args, **kwargs)

    return forward


def compiled_graphs() -> int:
    """Graphs torch.compile has captured in this process so far. It stays flat after the first step
    when every pack shape reuses the first graph; a rise mid-run is a recompilation, which every
    rank waits for (seconds for a large layer)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class RecompileWatch:
    """Warns when graphs were compiled since the last logged window (the first window's are expected)."""

    def __init__(self) -> None:
        self.seen: int | None = None

    def check(self, step: int) -> int:
        graphs = compiled_graphs()
        if self.seen is not None and graphs > self.seen:
            logger.warning("torch.compile captured %d new graph(s) before step %d: every rank waited for the "
                           "compilation (TORCH_LOGS=recompiles names the guard that failed)", graphs - self.seen, step)
        self.seen = graphs
        return graphs


class StepGarbageCollector:
    """train.gc_every_steps = N: Python's automatic garbage collection off while training, and one young-
    generation collection (gc.collect(1)) every N optimizer steps on every rank, at the same step (torchtitan
    and OLMo-core do the same). An automatic collection starts whenever allocations pass a threshold, at a
    different moment on each rank, and the rank paused in it holds the others at the next collective.
    `seconds` adds up what every collection took (the automatic ones too when N = 0): metrics.jsonl's `gc_s`."""

    def __init__(self, every_steps: int):
        self.every = every_steps
        self.seconds = 0.0
        self._started: float | None = None
        self._was_enabled = True
        self._collected_at: int | None = None

    def __enter__(self) -> StepGarbageCollector:
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect()  # the model build's garbage, once, before the clock runs
            gc.disable()
        gc.callbacks.append(self._clock)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._clock)
        if self.every and self._was_enabled:
            gc.enable()

    def after_step(self, step: int) -> None:
        if self._collected_at is None:
            self._collected_at = step - 1  # the step the run started or resumed at, where __enter__ collected
        if self.every and step - self._collected_at >= self.every:
            self.collect(step)

    def collect(self, step: int) -> None:
        """A collection now, at a step boundary; the next one N steps later. The loop also calls it right
        after a save: training is paused there anyway, and the save's planning has just made garbage."""
        if self.every:
            gc.collect(1)
            self._collected_at = step

    def take_seconds(self) -> float:
        """Seconds spent collecting since the last call."""
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _clock(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None


def make_deterministic(on_gpu_too: bool) -> None:
    """Bitwise-reproducible CPU runs (resume == uninterrupted); on GPU only with train.deterministic,
    whose kernels are slower. cuBLAS reads its workspace setting when its first handle is made (the
    first matmul, after this), and without it refuses deterministic mode."""
    if torch.cuda.is_available() and not on_gpu_too:
        return
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    # On the GPU strictly: torch's FlashAttention backward picks its deterministic order only when
    # warn_only is off (bench/gpu_determinism.py: under warn_only dq/dk/dv differ run to run).
    torch.use_deterministic_algorithms(True, warn_only=not torch.cuda.is_available())
