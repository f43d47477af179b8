"""Final export: a Hugging Face directory that ``AutoModelForCausalLM.from_pretrained`` loads.

``accelerator.get_state_dict`` consolidates the trained weights on rank 0's CPU (under FSDP2 with
``full_state_dict + cpu_offload``, shard by shard — never the whole model on one GPU); rank 0 then
writes safetensors shards, config.json, generation_config.json and the tokenizer with its chat
template. LoRA: the directory holds the adapter (adapter_config.json + adapter_model.safetensors);
with ``lora.merge_on_export`` it holds the merged full model and the adapter goes to ``adapter/``.
QLoRA: the NF4 base weights are gathered apart, each rank's shard dequantized and sent as a plain
tensor (train/engine/qlora.py ``full_state_dict`` says why), and only when the merge needs them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from contract.config import TrainConfig
from train.dataset.load import pad_id
from train.engine.qlora import full_state_dict

logger = logging.getLogger(__name__)


def export_model(
    accelerator: Accelerator, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, cfg: TrainConfig
) -> Path | None:
    """Collective (every rank calls it). Returns the export dir on rank 0, None elsewhere."""
    out = cfg.run.resolve(cfg.run.export_dir)
    unwrapped = accelerator.unwrap_model(model)
    merged = cfg.lora.enabled and cfg.lora.merge_on_export
    quantized = cfg.lora.enabled and cfg.lora.quant != "none"
    if quantized:  # the NF4 base dequantized shard by shard (the merge needs it), none for the adapter alone
        state_dict = full_state_dict(accelerator, model, _compute_dtype(unwrapped) if merged else None)
    else:
        state_dict = accelerator.get_state_dict(model)  # full, on CPU, only meaningful on rank 0
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        _set_special_tokens(_base_model(unwrapped), tokenizer)
        if merged:
            unwrapped.save_pretrained(out / "adapter", state_dict=state_dict)
            _merged_copy(unwrapped, state_dict, quantized=quantized).save_pretrained(out)
        else:
            unwrapped.save_pretrained(out, state_dict=state_dict)
        tokenizer.save_pretrained(out)
        logger.info("exported %s to %s", "LoRA adapter" if cfg.lora.enabled and not cfg.lora.merge_on_export
                    else "model", out)
    accelerator.wait_for_everyone()
    return out if accelerator.is_main_process else None


def _compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """QLoRA's compute dtype: its unquantized weights' (train/engine/model.py weights_dtype)."""
    return _base_model(model).get_input_embeddings().weight.dtype


def _base_model(model: torch.nn.Module) -> PreTrainedModel:
    get_base = getattr(model, "get_base_model", None)  # peft
    return get_base() if get_base is not None else model


def _set_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """generate() needs eos/pad ids; take them from the tokenizer we trained with."""
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=pad_id(tokenizer))
    for key, value in ids.items():
        setattr(model.config, key, value)
    if model.generation_config is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    for key, value in ids.items():
        setattr(model.generation_config, key, value)
    model.config.use_cache = True  # the exported model is for inference


def _merged_copy(peft_model: torch.nn.Module, state_dict: dict[str, torch.Tensor],
                 quantized: bool = False) -> PreTrainedModel:
    """Merged full model built on CPU from the consolidated state dict (works for sharded training too).
    QLoRA (`quantized`): the state dict holds the NF4 base weights dequantized (``full_state_dict``) and
    the merged model is bf16 (fp32 on a CPU run, whose compute dtype that is), the model the adapters
    were trained against."""
    from peft import get_peft_model

    base = _base_model(peft_model)
    if quantized:
        return _merged_dequantized(base, peft_model.peft_config["default"], state_dict)
    # The class's constructor, not from_config: under ZeRO-3 from_config builds inside zero.Init and
    # would hand back a partitioned (empty) model. fp32 on the CPU, as from_config would.
    fresh = type(base)(base.config).float()
    fresh.generation_config = base.generation_config
    merged = get_peft_model(fresh, peft_model.peft_config["default"])
    merged.load_state_dict(state_dict)
    return merged.merge_and_unload()


def _merged_dequantized(base: PreTrainedModel, peft_config: Any,
                        state_dict: dict[str, torch.Tensor]) -> PreTrainedModel:
    """QLoRA's merged model in the compute dtype, built on meta and given the dequantized weights (no
    random init and no fp32 copy: a 70B merge needs one bf16 model of RAM)."""
    from accelerate import init_empty_weights
    from peft import get_peft_model

    dtype = _compute_dtype(base)
    with init_empty_weights():
        fresh = type(base)._from_config(base.config, dtype=dtype)
    fresh.generation_config = base.generation_config
    merged = get_peft_model(fresh, peft_config)
    merged.load_state_dict({k: v.to(dtype) for k, v in state_dict.items()}, assign=True)
    unloaded = merged.merge_and_unload()
    unloaded.tie_weights()
    return unloaded
