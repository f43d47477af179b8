"""The peer: transformers' Trainer configured the way FastChat's train.py is (padded dynamic
batches of 8, sdpa attention, gradient checkpointing, bf16 autocast over fp32 weights, fused AdamW).

Run on one GPU: python bench/peer_fastchat.py --data DATA.jsonl --shape llama3.2-1b --steps 30
Prints one JSON line with real tokens/s, MFU and peak memory (bench/gpu_single.py drives it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from bench.synthetic import SHAPES, read_token_jsonl


def pad_collate(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Pad to the longest sequence in the batch (FastChat pads; loss ignores padding)."""
    longest = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    labels = torch.full((len(rows), longest), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        labels[i, :n] = ids[i, :n]
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


class TimedTrainer(Trainer):
    """Counts real (non-padding) tokens and times steps after a warm-up."""

    timing_warmup_steps = 3

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.real_tokens = 0
        self.step_count = 0
        self.t0: float | None = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.step_count == self.timing_warmup_steps:
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()
        if self.step_count >= self.timing_warmup_steps:
            self.real_tokens += int(inputs["attention_mask"].sum())
        self.step_count += 1
        return super().training_step(model, inputs, num_items_in_batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_out"))
    args = parser.parse_args()

    docs = read_token_jsonl(args.data)
    rows = [{"input_ids": d} for d in docs]
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape], use_cache=False)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32).cuda()
    targs = TrainingArguments(
        output_dir=str(args.out), per_device_train_batch_size=args.batch, max_steps=args.steps + 3,
        bf16=True, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        optim="adamw_torch_fused", learning_rate=2e-5, lr_scheduler_type="cosine", warmup_steps=0.03,
        weight_decay=0.0, logging_steps=1000, save_strategy="no", report_to=[], remove_unused_columns=False,
        dataloader_drop_last=True, seed=0,
    )
    trainer = TimedTrainer(model=model, args=targs, train_dataset=rows, data_collator=pad_collate)
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - trainer.t0
    print(json.dumps({
        "path": "peer-fastchat", "real_tokens": trainer.real_tokens, "seconds": elapsed,
        "real_tokens_per_s": trainer.real_tokens / elapsed,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
    }))


if __name__ == "__main__":
    main()
