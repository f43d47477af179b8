"""The peer: transformers' Trainer configured the way FastChat's train.py is (padded dynamic
batches of 8, sdpa attention, gradient checkpointing, bf16 autocast over fp32 weights, fused AdamW).

One epoch over every document of DATA (the same documents as ours; the last batch may hold fewer
than 8). Run on one GPU: python -m bench.peers.peer_fastchat --data DATA.jsonl --shape llama3.2-1b
Prints one JSON line with real tokens and seconds after the warm-up steps on the shared clock
(bench/peers/peer_clock.py) and peak memory (bench/suites/gpu_single.py drives it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from bench.peers.peer_clock import TimedSteps
from bench.common.synthetic import SHAPES, read_token_jsonl


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


class TimedTrainer(TimedSteps, Trainer):
    """Trainer on the shared peer clock (bench/peers/peer_clock.py)."""

    def count_real_tokens(self, inputs):
        return int(inputs["attention_mask"].sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shape", default="llama3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("/tmp/peer_out"))
    args = parser.parse_args()

    docs = read_token_jsonl(args.data)
    rows = [{"input_ids": d} for d in docs]
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[args.shape], use_cache=False)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32).cuda()
    targs = TrainingArguments(
        output_dir=str(args.out), per_device_train_batch_size=args.batch, num_train_epochs=1,
        bf16=True, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
        optim="adamw_torch_fused", learning_rate=2e-5, lr_scheduler_type="cosine", warmup_steps=0.03,
        weight_decay=0.0, logging_steps=1000, save_strategy="no", report_to=[], remove_unused_columns=False,
        dataloader_drop_last=False, seed=0,
    )
    trainer = TimedTrainer(model=model, args=targs, train_dataset=rows, data_collator=pad_collate)
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    print(json.dumps(trainer.result("peer-fastchat")))


if __name__ == "__main__":
    main()
