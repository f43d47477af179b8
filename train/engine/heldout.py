"""Loss on the held-out eval sets, per source: the training's periodic eval and `sft-launch eval`'s `heldout`.

One computation for both, so they agree: each eval set is packed (or padded) into micro-batches with
the run's token budget and seed, exactly as the training packs its data, and its token-loss sum and
label-token count are summed over the micro-batches and the ranks (every rank runs the same number
of forwards: DDP syncs buffers and FSDP gathers in forward; a rank without a micro-batch of its own
repeats the last one and drops its loss). A source's loss is its sum over its label tokens; the
overall `eval_loss` weighs the sources by their label tokens.

`evaluate_export` is the `heldout` task of `python -m train.evaluate`: the run's own train.toml
rebuilds the per-source eval sets (from the run's tokenized cache when it is there), the exported
model is loaded with the run's attention backend, and its forwards run under the run's mixed
precision, so at the training's last step the numbers equal that step's `eval_loss/<source>`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from accelerate.utils import reduce

from contract.config import TrainConfig
from contract.schema import ConfigError
from train.dataset.load import build_datasets, load_tokenizer, pad_id
from train.dataset.packing import collate, plan_micro_batches, to_device
from train.kernels.attention import setup_attention
from train.kernels.context_parallel import ContextParallel, label_tokens

logger = logging.getLogger(__name__)


@torch.no_grad()
def eval_sums(model: torch.nn.Module, dataset: Any, budget: int, seed: int, packed: bool, pad_id: int,
              device: torch.device, world: int, rank: int, fixed_length: int | None = None,
              cp: ContextParallel | None = None) -> torch.Tensor:
    """(token-loss sum, label tokens) of one eval set over all ranks, as float64 on the CPU.
    `fixed_length`: packed rows filled up to it, as the training's (its filler has no label tokens).
    `cp`: context parallelism, as the training's: a group's ranks share a micro-batch, a slice each."""
    cp = cp or ContextParallel()
    world, rank = cp.data_world(world), cp.data_rank(rank)
    plan = plan_micro_batches(list(dataset["length"]), budget, seed, 0)
    sums = torch.zeros(2, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    one = torch.ones((), device=device)
    for j in range(math.ceil(len(plan) / world)):
        g = j * world + rank
        examples = [dataset[i] for i in plan[min(g, len(plan) - 1)]]
        batch = cp.shard(collate(examples, packed, pad_id, fixed_length), pad_id)
        loss_sum = model(**to_device(batch, device), num_items_in_batch=one).loss
        if g < len(plan):
            sums += torch.stack([loss_sum.double(), torch.tensor(label_tokens(batch), dtype=torch.float64,
                                                                 device=device)])
    model.train(was_training)
    return reduce(sums, reduction="sum").cpu()


def loss_record(sums: dict[str, torch.Tensor]) -> dict[str, float]:
    """metrics.jsonl's eval record: `eval_loss` over every set, `eval_loss/<source>` for each named one."""
    total = torch.stack(list(sums.values())).sum(dim=0)
    record = {"eval_loss": float(total[0] / torch.clamp(total[1], min=1.0))}
    for name, (loss, tokens) in sums.items():
        if name:
            record[f"eval_loss/{name}"] = float(loss / torch.clamp(tokens, min=1.0))
    return record


def _row(loss_sum: float, tokens: float, examples: int) -> dict[str, Any]:
    loss = loss_sum / max(tokens, 1.0)
    return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": int(tokens), "examples": examples}


def _autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The training's mixed precision (what Accelerate wraps its forward in)."""
    from train.engine.model import mixed_precision

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision(precision))
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def _load_model(model_dir: Path, cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """The export (a full model, or an adapter on its base) with the run's attention backend."""
    from transformers import AutoModelForCausalLM

    from train.engine.model import attention_features

    attn = setup_attention(cfg.model.attn_implementation, device, cfg.data.packing, attention_features(cfg))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto", attn_implementation=attn,
                                                 local_files_only=True)
    model.config.use_cache = False  # as trained: no KV cache
    return model.to(device).eval()


def evaluate_export(model_dir: Path, cfg: TrainConfig) -> dict[str, Any]:
    """Per-source eval loss, perplexity, label tokens and examples of the exported model (every rank
    calls it; each gets the summed numbers). ConfigError when the run has no eval split."""
    state = PartialState()
    tokenizer = load_tokenizer(cfg)
    bundle = build_datasets(cfg, tokenizer, is_main=state.is_local_main_process, barrier=state.wait_for_everyone)
    sets = bundle.eval_sets
    if not sets:
        raise ConfigError("--tasks heldout: the run has no eval examples (set data.eval_fraction, or a source's "
                          "eval_fraction / eval_path / eval_split, in its train.toml)", "data.eval_fraction")
    padding = pad_id(tokenizer)
    model = _load_model(model_dir, cfg, state.device)
    label = cfg.data.source_list()[0].label
    sums = {}
    with _autocast(cfg.model.precision, state.device):
        for name, dataset in sets.items():
            logger.info("held-out loss of %s: %d examples", name or label, len(dataset))
            sums[name] = eval_sums(model, dataset, cfg.micro_batch_tokens, cfg.train.seed, cfg.data.packing,
                                   padding, state.device, state.num_processes, state.process_index)
    del model
    sources = [{"name": name or label, **_row(float(s[0]), float(s[1]), len(sets[name]))} for name, s in sums.items()]
    total = torch.stack(list(sums.values())).sum(dim=0)
    overall = _row(float(total[0]), float(total[1]), sum(len(d) for d in sets.values()))
    return {"sources": sources, "all": overall, "metrics": loss_record(sums)}
