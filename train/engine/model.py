"""Build the model to train: random init (tiny) or pretrained weights read by one process only,
RoPE scaling, LoRA, non-reentrant gradient checkpointing, ``use_cache=False``.

Rank-0-only loading, per distribution type:

* FSDP (GPU, and CPU over gloo through ``train.engine.sharding``): transformers 5.x skips reading weights
  only on ranks that are not *local* rank 0 (``modeling_utils``: ``is_fsdp_enabled() and not
  is_local_dist_rank_0()``) — one reader per *node*. We go further: only global rank 0 reads; the
  others build the model on the meta device and take uninitialised CPU storage (``to_empty``: pages
  never touched, so no RSS), which Accelerate's ``cpu_ram_efficient_loading`` fills by broadcast
  from rank 0 while sharding. The non-persistent buffers (RoPE ``inv_freq``) are not in that
  broadcast, so we send them first.
* DeepSpeed: from_pretrained's own ZeRO-3 handling.
* DDP (a launch without FSDP: plain multi-GPU, or CPU): done here. Rank 0 reads the safetensors;
  the other ranks build the model on the meta device (no memory), materialise empty storage, and
  receive every parameter and buffer (RoPE ``inv_freq`` included) by broadcast from rank 0.
Each rank logs its peak RSS before and after, so the saving can be checked in the logs.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, PretrainedConfig, PreTrainedModel

from contract import gpus
from contract.attention import AttentionFeatures
from contract.config import TrainConfig, fp8_linears
from contract.schema import ConfigError
from contract.shape import EXPERT_LORA_TARGETS, rope_factor
from train.kernels import float8, swiglu
from train.kernels.long_context import chunk_mlps
from train.kernels.loss import logit_grad_pass
from train.observe.metrics import gpu_spec, mfu_peaks_line, peak_rss_mib
from train.kernels.perf import (compile_decoder_layers, compiles_decoder_layers, decoder_layers, enable_checkpointing,
                                gather_lm_head_with_root, use_fused_loss)
from train.engine.qlora import build_quantized_model
from train.engine.sharded_init import build_on_meta
from train.moe.hf import adapt_experts_in_place, experts_modules, use_grouped_experts
from train.moe.router import RouterLoss

logger = logging.getLogger(__name__)


def mixed_precision(precision: str) -> str:
    """Accelerate's mixed_precision value for model.precision on this machine (one rule: contract.gpus)."""
    on_gpu = torch.cuda.is_available()
    return gpus.mixed_precision(precision, on_gpu, torch.cuda.is_bf16_supported() if on_gpu else None)


def weights_dtype(cfg: TrainConfig, uniform: bool = False) -> torch.dtype:
    """fp32 master weights for what trains; bf16/fp16 compute comes from Accelerate's mixed precision
    (autocast / FSDP policy). A LoRA run's frozen base needs no master copy, so it is stored in the
    compute dtype (as the planner assumes): half the memory, and autocast no longer casts every base
    weight at every forward. The adapters stay fp32 (apply_lora). `uniform`: the wrapper needs one
    dtype per wrapped unit (FSDP1 flattens a decoder layer into one FlatParameter), so a LoRA base
    stays fp32 beside its fp32 adapters."""
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": torch.float32}[mixed_precision(cfg.model.precision)]
    return compute if cfg.lora.enabled and not uniform else torch.float32


def is_fsdp1(accelerator: Accelerator) -> bool:
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return accelerator.distributed_type == DistributedType.FSDP and getattr(plugin, "fsdp_version", 2) == 1


def build_config(cfg: TrainConfig) -> PretrainedConfig:
    """The checkpoint's config, or for a random init model.arch's: a LlamaConfig, or the config of the family
    arch's `model_type` names (a Qwen3-MoE or gpt-oss shape: bench/suites/gpu_moe_lora.py); RoPE scaling applied."""
    arch = cfg.model.arch
    if cfg.model.path:
        config = AutoConfig.from_pretrained(cfg.model.path)
    elif arch.get("model_type", "llama") != "llama":
        config = AutoConfig.for_model(**arch)
    else:
        config = LlamaConfig(**arch)
    config.use_cache = False  # no KV cache while training (and required by gradient checkpointing)
    if cfg.model.rope_scaling:
        apply_rope_scaling(config, cfg.train.model_max_length)
    return config


def attention_features(cfg: TrainConfig) -> AttentionFeatures:
    """The sliding windows and attention sinks of the model to build (contract/attention.py), for
    setup_attention to pick or refuse a backend by."""
    return AttentionFeatures.from_config(build_config(cfg).to_dict(), cfg.train.model_max_length)


def attention_heads(cfg: TrainConfig) -> tuple[int, int]:
    """(query heads, key/value heads) of the model to build: what context parallelism splits."""
    config = build_config(cfg)
    heads = config.num_attention_heads
    return heads, getattr(config, "num_key_value_heads", None) or heads


def moe_experts(cfg: TrainConfig) -> tuple[int | None, str]:
    """(experts per MoE layer, model type) of the model to build: what expert parallelism splits (None
    experts: a dense model)."""
    config = build_config(cfg)
    return getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None), config.model_type


def apply_rope_scaling(config: PretrainedConfig, model_max_length: int) -> None:
    """Linear RoPE interpolation by ceil(max_length / context) when training past the context (FastChat)."""
    context = getattr(config, "max_position_embeddings", None)
    stretch = rope_factor(model_max_length, context)
    if stretch is None:
        return
    factor = float(stretch)
    params = dict(getattr(config, "rope_parameters", None) or {})
    if set(params) and set(params) <= set(getattr(config, "layer_types", None) or ()):
        # Per layer type (Gemma 3): stretch the global layers only, as Gemma 3's own long-context configs do;
        # a sliding layer never sees a distance beyond its window, inside the trained context.
        per_type = {kind: _linear(layer, factor) if kind != "sliding_attention" else layer
                    for kind, layer in params.items()}
        stretched = None if None in per_type.values() else per_type
    else:
        stretched = _linear(params, factor)
    if stretched is None:
        logger.warning("model already has rope %s; not rescaling", params)
        return
    config.rope_parameters = stretched
    config.max_position_embeddings = model_max_length
    logger.info("RoPE linear scaling x%.0f (context %d -> %d)", factor, context, model_max_length)


def _linear(params: dict[str, Any], factor: float) -> dict[str, Any] | None:
    """One RoPE parameter dict stretched linearly by `factor`; None when it already has a scaling of its own."""
    if params.get("rope_type", "default") != "default":
        return None
    return {**params, "rope_type": "linear", "factor": factor}


def random_init(config: PretrainedConfig, accelerator: Accelerator, kwargs: dict[str, Any]) -> PreTrainedModel:
    """A model with random weights (no model.path: tests, benchmarks), the same seed on every rank.
    One process initialises on its own device (an 8B init takes minutes on the CPU, seconds on a
    GPU); several processes build on the CPU, as the sharding that follows expects. Too large for
    that (a 70B shape): model.init = "sharded" (train/engine/sharded_init.py)."""
    if accelerator.num_processes == 1:
        with torch.device(accelerator.device):
            return AutoModelForCausalLM.from_config(config, **kwargs)
    return AutoModelForCausalLM.from_config(config, **kwargs)


def weights_in_checkpoint(cfg: TrainConfig, accelerator: Accelerator) -> bool:
    """Whether a resume finds every weight in the checkpoint, so model.path's need not be read (at 8B a 16 GB
    read on rank 0 and its broadcast, all overwritten by load_state): a full fine-tune under FSDP2 (a LoRA
    checkpoint holds the adapters only). The model is then built as model.init = "sharded" builds it: on the
    meta device, each rank's shards drawn where they live, then overwritten by the checkpoint."""
    return (bool(cfg.model.path) and cfg.model.init == "full" and not cfg.lora.enabled
            and cfg.train.precision != "fp8" and accelerator.distributed_type == DistributedType.FSDP
            and accelerator.is_fsdp2)


def build_model(cfg: TrainConfig, accelerator: Accelerator, attn_implementation: str) -> PreTrainedModel:
    config = build_config(cfg)
    kwargs: dict[str, Any] = dict(attn_implementation=attn_implementation,
                                  dtype=weights_dtype(cfg, uniform=is_fsdp1(accelerator)))
    rss_before, started = peak_rss_mib(), time.perf_counter()
    if cfg.lora.quant == "nf4":
        source = quantization_source(cfg, config, accelerator, kwargs)
        model = build_quantized_model(cfg, config, accelerator, kwargs, source)
    elif cfg.model.init == "sharded":  # drawn per shard after sharding (train/engine/optim.py)
        model = build_on_meta(config, kwargs)
    elif not cfg.model.path:
        model = random_init(config, accelerator, kwargs)
    elif accelerator.distributed_type in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        model = _load_on_rank0_and_broadcast(cfg.model.path, config, accelerator, kwargs)
    elif accelerator.distributed_type == DistributedType.FSDP and accelerator.num_processes > 1:
        model = load_for_fsdp(cfg.model.path, config, accelerator, kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(cfg.model.path, config=config, **kwargs)
    logger.info("rank %d peak RSS: %.0f MiB before model load, %.0f MiB after (%.1f s)",
                accelerator.process_index, rss_before, peak_rss_mib(), time.perf_counter() - started)
    model.config.use_cache = False
    if experts := use_grouped_experts(model):
        logger.info("mixture of experts: %d experts modules as grouped GEMMs (train/moe/experts.py)", experts)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model, cfg.train)
        if not cfg.train.recompute_attention:
            logger.info("checkpointing keeps the attention outputs (train.recompute_attention = false)")
    if cfg.train.fused_loss:  # no vocabulary-sized logits (train/kernels/loss.py)
        use_fused_loss(model, "auto" if cfg.train.fused_loss is True else cfg.train.fused_loss)
        logger.info("fused loss %r; its softmax/gradient pass here: %s", cfg.train.fused_loss,
                    logit_grad_pass(accelerator.device))
    RouterLoss.install(model, cfg.train.router_aux_loss_coef, cfg.train.gradient_accumulation_steps)
    if cfg.train.precision == "fp8":  # before compile and before FSDP2 wraps the layers
        apply_float8(model, cfg, accelerator)
    elif cfg.asks_for_fused_mlp:
        apply_fused_mlp(model, cfg, accelerator)
    if cfg.train.mlp_chunk_tokens:  # after the fused MLP or FP8: it chunks whichever MLP forward runs
        count = chunk_mlps([layer.mlp for layer in decoder_layers(model)], cfg.train.mlp_chunk_tokens)
        logger.info("MLP over chunks of %d tokens in %d decoder layers", cfg.train.mlp_chunk_tokens, count)
    if compiles_decoder_layers(cfg, accelerator.num_processes):
        compile_decoder_layers(model)  # +32% tokens/s on H200 in files removed in #33; slow to compile on CPU
    elif cfg.sharded_qlora_stays_eager(accelerator.num_processes):
        logger.info("torch.compile of the decoder layers off: QLoRA sharded over %d ranks (auto)",
                    accelerator.num_processes)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg)
    if cfg.train.fused_loss and zero_stage(accelerator) == 3:
        gather_lm_head_with_root(model)
    return model


def quantization_source(cfg: TrainConfig, config: PretrainedConfig, accelerator: Accelerator,
                        kwargs: dict[str, Any]) -> PreTrainedModel | None:
    """QLoRA's weights: global rank 0 reads the checkpoint into CPU memory (bf16), the others read
    nothing; None for a random init (train/engine/qlora.py)."""
    if not cfg.model.path or not accelerator.is_main_process:
        return None
    return AutoModelForCausalLM.from_pretrained(cfg.model.path, config=config, **kwargs)


def apply_float8(model: PreTrainedModel, cfg: TrainConfig, accelerator: Accelerator) -> None:
    """train.precision = "fp8": the decoder's linear layers as float8 linears (train/kernels/float8.py);
    a one-line ConfigError (exit 2) where this device or engine cannot run them. The fused SwiGLU MLP
    (bf16 GEMMs of its own) stays off: the MLP's projections are the largest FP8 matmuls."""
    blocker = float8.unavailable(accelerator.device)
    if blocker is None and (zero_stage(accelerator) is not None or is_fsdp1(accelerator)):
        blocker = "it needs FSDP2 or one GPU, not DeepSpeed or FSDP1"
    if blocker:
        raise ConfigError(f"train.precision: fp8 cannot be used: {blocker}", "train.precision")
    all_gather = cfg.train.fp8_all_gather and accelerator.distributed_type == DistributedType.FSDP
    count = float8.convert_decoder_linears(decoder_layers(model), cfg.train.fp8_recipe, cfg.train.fp8_fast_accum,
                                           all_gather)
    logger.info("FP8 (%s scaling, %s forward accumulation): %d linear layers of %d decoder layers in float8 (%s); "
                "fused SwiGLU MLP off; weights all-gathered in %s", cfg.train.fp8_recipe,
                "fast" if cfg.train.fp8_fast_accum else "fp32", count, len(decoder_layers(model)),
                {"torchao": "torchao's Float8Linear", "ours": "ours"}[fp8_linears(cfg.train.fp8_recipe, all_gather)],
                "float8" if all_gather else "bf16")
    if (spec := gpu_spec(cfg.run.gpu_type)) is not None:
        logger.info("%s", mfu_peaks_line(spec))


def apply_fused_mlp(model: PreTrainedModel, cfg: TrainConfig, accelerator: Accelerator) -> None:
    """train.fused_mlp: "auto" routes every decoder layer's MLP through train/kernels/swiglu.py where it can
    run (and says why not where it cannot); true fails with a one-line error where it cannot."""
    blocker = swiglu.unavailable(accelerator.device, cfg.lora.enabled, zero_stage(accelerator))
    layers = decoder_layers(model)
    fused = 0 if blocker else swiglu.use_fused_swiglu([layer.mlp for layer in layers])
    if fused == 0 and blocker is None:
        blocker = "the model's MLP is not a bias-free SiLU-gated Llama MLP"
    if blocker and cfg.train.fused_mlp is True:
        raise ConfigError(f"train.fused_mlp: cannot be used: {blocker}", "train.fused_mlp")
    if blocker:
        logger.info("fused SwiGLU MLP off: %s", blocker)
    else:
        logger.info("fused SwiGLU MLP (quack GEMMs): %d of %d decoder layers", fused, len(layers))


def zero_stage(accelerator: Accelerator) -> int | None:
    """DeepSpeed's ZeRO stage, None when not under DeepSpeed."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return None
    return int(accelerator.state.deepspeed_plugin.zero_stage)


def log_placement(accelerator: Accelerator) -> None:
    """Where this rank landed (every rank logs it, like the RSS facts): torchrun's GROUP_RANK is the
    node's machine rank (0 and 1 on a 2-node job, never 0 on both), LOCAL_RANK the process in the node."""
    logger.info("rank %d of %d: node rank %s, local rank %s, host %s", accelerator.process_index,
                accelerator.num_processes, os.environ.get("GROUP_RANK", "?"), os.environ.get("LOCAL_RANK", "?"),
                socket.gethostname())


def log_model_ready(accelerator: Accelerator, started: float) -> None:
    """Every rank: peak RSS once the model is sharded/wrapped (rank-0-only loading is judged on it)."""
    logger.info("rank %d peak RSS %.0f MiB once sharded; model ready %.1f s after load started",
                accelerator.process_index, peak_rss_mib(), time.perf_counter() - started)


def _load_on_rank0_and_broadcast(
    path: str, config: PretrainedConfig, accelerator: Accelerator, kwargs: dict[str, Any]
) -> PreTrainedModel:
    model, rss_at_broadcast = load_on_rank0(path, config, accelerator, kwargs)
    logger.info("rank %d peak RSS %.0f MiB when weights reached the broadcast", accelerator.process_index,
                rss_at_broadcast)
    return model


def load_on_rank0(
    path: str, config: PretrainedConfig, accelerator: Accelerator, kwargs: dict[str, Any]
) -> tuple[PreTrainedModel, float]:
    """Rank 0 reads the checkpoint, the others build on meta and receive it by broadcast.

    Returns the model and this rank's peak RSS (MiB) just before the broadcast: on ranks > 0 it
    stays at the baseline, since nothing was read or allocated yet.
    """
    if accelerator.is_main_process:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    rss_at_broadcast = peak_rss_mib()
    if not accelerator.is_main_process:
        model.to_empty(device="cpu")
        model.tie_weights()  # to_empty re-creates parameters; restore the embedding/lm_head tie
    broadcast_module(model, accelerator.device)
    return model, rss_at_broadcast


def load_for_fsdp(
    path: str, config: PretrainedConfig, accelerator: Accelerator, kwargs: dict[str, Any]
) -> PreTrainedModel:
    """Global rank 0 reads the checkpoint; the others get shapes only (see the module docstring)."""
    if accelerator.is_main_process:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
        model.to_empty(device="cpu")
        model.tie_weights()
    with torch.no_grad():
        for _name, buffer in model.named_buffers():
            staged = buffer.to(accelerator.device)
            dist.broadcast(staged, src=0)
            buffer.copy_(staged)
    return model


@torch.no_grad()
def broadcast_module(model: torch.nn.Module, device: torch.device) -> None:
    """Copy rank 0's parameters and buffers to every rank (tensor by tensor: bounded extra memory)."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    for _name, tensor in tensors:
        staged = tensor.data.to(device) if tensor.device != device else tensor.data
        dist.broadcast(staged, src=0)
        if staged is not tensor.data:
            tensor.data.copy_(staged)


def apply_lora(model: PreTrainedModel, cfg: TrainConfig) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    modules, parameters = lora_targets(model, cfg.lora.target_modules)
    lora = LoraConfig(
        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
        target_modules=modules, target_parameters=parameters or None, task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    if parameters and (adapted := adapt_experts_in_place(peft_model)):
        logger.info("LoRA on the experts: %d stacked expert weights, rank %d per expert, inside the grouped GEMMs",
                    adapted, cfg.lora.r)
    for parameter in peft_model.parameters():
        if parameter.requires_grad:  # the adapters: fp32 master weights, like full fine-tuning
            parameter.data = parameter.data.float()
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    logger.info("LoRA r=%d: %d trainable of %d parameters (%.2f%%)", cfg.lora.r, trainable, total,
                100.0 * trainable / total)
    return peft_model


def lora_targets(model: PreTrainedModel, names: list[str]) -> tuple[list[str], list[str]]:
    """(PEFT target_modules, PEFT target_parameters) for lora.target_modules: the MoE names
    (contract.shape.EXPERT_LORA_TARGETS) are weight parameters; one that this model lacks is a ConfigError,
    never an adapter silently left out."""
    router = {"qwen3_moe": "mlp.gate.weight", "gpt_oss": "mlp.router.weight"}.get(model.config.model_type)
    experts = bool(experts_modules(model))
    modules, parameters = [], []
    for name in names:
        if name not in EXPERT_LORA_TARGETS:
            modules.append(name)
        elif name == "router" and router is None or name != "router" and not experts:
            raise ConfigError(f"lora.target_modules: {name!r} names no weight of this model "
                              f"({model.config.model_type}: "
                              f"{'no routed experts' if not experts else 'router unknown'})",
                              "lora.target_modules")
        else:
            parameters.append(router if name == "router" else name)
    return modules, parameters
