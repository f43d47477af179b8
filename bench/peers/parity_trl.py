"""The TRL side of bench/suites/gpu_parity.py: SFTTrainer, padding-free (positions restart per document), from
the same saved initial checkpoint, on the same token documents, with our optimizer
and schedule (AdamW 0.9/0.95, peak LR, warmup, cosine to 0: train/engine/optim.py's LambdaLR given to
the Trainer, whose own warmup starts a step later), max steps, clipping and tokens per step (one
packed row of --max-length tokens) as our side. bf16 autocast over fp32 weights, fused AdamW,
no gradient checkpointing, flex_attention and Liger's kernels on a GPU (TRL's speed recipe, as
bench/peers/peer_trl.py), SDPA and no Liger on a CPU.

Which documents share a step: `--packs ours` (default) gives TRL our packed rows in our order
(bench/arithmetic.our_packs: train/dataset/packing.py's plan for --seed, each row's `seq_lengths` for
TRL's padding-free collator, the sequential sampler), so both sides take the same optimizer steps on
the same tokens and only the implementations differ; `--packs bfd` lets TRL pack (BFD) and shuffle on
its own, as a user's run would. Why: on an H100, ours / TRL eval loss was 1.0151 with TRL's own order
and 0.9983 with our packs (BENCHMARKS.md, issue #27).

    python -m bench.peers.parity_trl --init DIR --data DOCS.jsonl --out DIR --steps N --max-length T --lr LR

Saves the trained model to OUT/export and prints one JSON line: the loss of every optimizer step and
the throughput on the shared peer clock (bench/peers/peer_clock.py).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from torch.utils.data import SequentialSampler
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from bench.common.arithmetic import our_packs
from bench.peers.peer_clock import TimedSteps
from bench.common.synthetic import read_token_jsonl
from train.engine.optim import lr_multiplier


class ParitySFTTrainer(SFTTrainer):
    """SFTTrainer that, with `in_order`, takes the rows in the dataset's order (our packs: the sampler, not
    TrainingArguments, since transformers' `train_sampling_strategy` is recent)."""

    in_order = False

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset) if self.in_order else super()._get_train_sampler(*args, **kwargs)


class TimedSFTTrainer(TimedSteps, ParitySFTTrainer):
    def count_real_tokens(self, inputs):
        return int(inputs["input_ids"].numel())  # padding-free: one row of real tokens


def schedule(model: torch.nn.Module, args: argparse.Namespace) -> tuple[torch.optim.Optimizer, Any]:
    """Our optimizer and learning-rate schedule (train/engine/optim.py: AdamW 0.9/0.95, no weight decay here,
    warmup reaching the peak at its last step, cosine to 0), so both sides step with the same LR."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0,
                                  fused=torch.cuda.is_available())
    warmup = math.ceil(args.warmup_ratio * args.steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, args.steps, warmup, "cosine", 0.0))
    return optimizer, scheduler


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--init", "--data", "--out"):
        parser.add_argument(name, type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--warmup-ratio", type=float, default=0.03)
    parser.add_argument("--packs", choices=("ours", "bfd"), default="ours", help="our packed rows in our order, "
                        "or TRL's own BFD packing and shuffle")
    parser.add_argument("--seed", type=int, default=42, help="--packs ours: train.seed of our side")
    parser.add_argument("--attn", default="", help="attention implementation (default: flex_attention on a GPU, "
                                                   "sdpa on a CPU)")
    parser.add_argument("--stack-every", type=int, default=0, help="every thread's Python stack to stderr every N s "
                                                                   "(0: off): where a slow first step spends its time")
    args = parser.parse_args()
    if args.stack_every > 0:
        faulthandler.dump_traceback_later(args.stack_every, repeat=True)
    gpu = torch.cuda.is_available()
    docs = read_token_jsonl(args.data)
    ours = args.packs == "ours"
    rows = Dataset.from_dict(our_packs(docs, args.max_length, args.seed, args.steps) if ours else {"input_ids": docs})
    tokenizer = AutoTokenizer.from_pretrained(args.init, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.init, dtype=torch.float32,
                                                 attn_implementation=args.attn or ("flex_attention" if gpu else "sdpa"))
    config = SFTConfig(
        output_dir=str(args.out), max_length=None if ours else args.max_length, packing=not ours, packing_strategy="bfd",
        padding_free=True, per_device_train_batch_size=1, max_steps=args.steps, bf16=gpu, use_cpu=not gpu,
        use_liger_kernel=gpu, learning_rate=args.lr,
        weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=False, logging_steps=1,
        save_strategy="no", report_to=[], seed=42, data_seed=42, dataset_num_proc=1,
    )
    trainer_class = TimedSFTTrainer if gpu else ParitySFTTrainer  # the clock synchronizes CUDA
    trainer = trainer_class(model=model, args=config, train_dataset=rows, processing_class=tokenizer,
                            optimizers=schedule(model, args))
    trainer.in_order = ours
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    faulthandler.cancel_dump_traceback_later()
    trainer.save_model(str(args.out / "export"))
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    timing = trainer.result("trl") if gpu else {"path": "trl"}
    print(json.dumps({**timing, "losses": losses, "export": str(args.out / "export")}))


if __name__ == "__main__":
    main()
