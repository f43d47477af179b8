"""Padding-free packing of tokenized examples into micro-batches, and the padded alternative.

Plan: best-fit-decreasing of example lengths into bins of at most `budget` tokens, then a
deterministic shuffle of the bins by (seed, epoch). Every rank computes the same global plan;
rank r of W takes micro-batches r, r+W, … (see docs/ARCHITECTURE.md).

A packed micro-batch is one row of concatenated documents with positions restarting at 0 per
document and `cu_seq_lens_*` marking the boundaries for varlen attention kernels.

Labels are *not* shifted here: transformers' causal-LM loss compares logits at t with label t+1.
At a boundary, position t is the last token of document j-1 and label t+1 is the first token of
document j, which would train document j's first token from document j-1's context. Setting the
first label of every document to -100 removes exactly that term (a document's first token has
no context of its own to be predicted from anyway).

Fixed-length rows (`pad_to`, used when the decoder layers are torch.compile'd): the row is filled up
to the budget with one filler segment of its own — its own cu_seq_lens boundary (attention never
mixes it with a document), labels all -100 (no loss, no gradient), positions 0..n-1, input ids the
pad id — so every micro-batch of the run has one shape and the compiled layers never recompile
(a pack of a new length did, at a different step on every rank, and the others waited). The filler
is wasted compute, never a real token: throughput, MFU and packing efficiency count documents only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from contract.packing import pack_bins

IGNORE_INDEX = -100


def plan_micro_batches(lengths: Sequence[int], budget: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices per micro-batch: best-fit-decreasing into `budget`-token bins, shuffled by (seed, epoch).

    An example longer than `budget` gets a bin of its own (collate_packed truncates it; see
    `count_over_budget`). The result depends only on the arguments, so every rank agrees.
    """
    bins = pack_bins(lengths, budget)  # contract/packing.py: the plan counts micro-batches with it too
    # Seeded by integers only (not hash()), so the order is identical in every process.
    random.Random(seed * 1_000_003 + epoch).shuffle(bins)
    return bins


def count_over_budget(lengths: Sequence[int], budget: int) -> int:
    """How many examples a packed run truncates to the budget."""
    return sum(1 for n in lengths if n > budget)


def packing_efficiency(plan: Sequence[Sequence[int]], lengths: Sequence[int], budget: int) -> float:
    """Real tokens / token slots (bins × budget): 1.0 means no slot of any micro-batch is wasted."""
    if not plan:
        return 0.0
    real = sum(min(lengths[i], budget) for micro_batch in plan for i in micro_batch)
    return real / (len(plan) * budget)


def collate_packed(examples: Sequence[dict[str, Any]], budget: int | None = None,
                   pad_to: int | None = None, filler_id: int = 0) -> dict[str, Any]:
    """One packed row from examples with `input_ids` and `labels`; see the module doc for the fields.

    `budget` (optional) truncates each example to it, matching plan_micro_batches. `pad_to` fills the
    row up to that many tokens with one filler segment of `filler_id` (module doc); a row whose
    documents already exceed it is a packing bug (plan_micro_batches never makes one) and raises.
    """
    if not examples:
        raise ValueError("collate_packed needs at least one example")
    input_ids, labels, positions, bounds = [], [], [], [0]
    for example in examples:
        ids, labs = list(example["input_ids"]), list(example["labels"])
        if len(ids) != len(labs):
            raise ValueError(f"input_ids and labels differ in length ({len(ids)} vs {len(labs)})")
        if budget is not None:
            ids, labs = ids[:budget], labs[:budget]
        labs[0] = IGNORE_INDEX  # never predict a document's first token from the previous document
        input_ids += ids
        labels += labs
        positions += range(len(ids))
        bounds.append(bounds[-1] + len(ids))
    if pad_to is not None and (filler := _filler_length(bounds[-1], pad_to)):
        input_ids += [filler_id] * filler
        labels += [IGNORE_INDEX] * filler
        positions += range(filler)
        bounds.append(pad_to)
    cu_seq_lens = torch.tensor(bounds, dtype=torch.int32)
    max_length = int(max(b - a for a, b in zip(bounds, bounds[1:])))  # the filler is a segment too
    return {
        "input_ids": torch.tensor([input_ids], dtype=torch.long),
        "labels": torch.tensor([labels], dtype=torch.long),
        "position_ids": torch.tensor([positions], dtype=torch.long),
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens.clone(),
        "max_length_q": max_length,
        "max_length_k": max_length,
    }


def _filler_length(real: int, pad_to: int) -> int:
    if real > pad_to:
        raise ValueError(f"packed micro-batch of {real} tokens exceeds the {pad_to}-token budget it is padded to")
    return pad_to - real


def collate_padded(examples: Sequence[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch [B, T]: pad tokens get label -100 and attention_mask 0."""
    if not examples:
        raise ValueError("collate_padded needs at least one example")
    width = max(len(example["input_ids"]) for example in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        n = len(example["input_ids"])
        input_ids[row, :n] = torch.as_tensor(example["input_ids"], dtype=torch.long)
        labels[row, :n] = torch.as_tensor(example["labels"], dtype=torch.long)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def collate(examples: Sequence[dict[str, Any]], packed: bool, pad_id: int,
            fixed_length: int | None = None) -> dict[str, Any]:
    """One micro-batch on the CPU: packed into one row, else padded with `pad_id`. `fixed_length`
    (packed only): examples truncated to it and the row filled up to it (module doc: fixed-length rows)."""
    if not packed:
        return collate_padded(examples, pad_id)
    return collate_packed(examples, budget=fixed_length, pad_to=fixed_length, filler_id=pad_id)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Asynchronous copy: a plain .to(cuda) from pageable memory waits for the GPU, which would stall
    the CPU from preparing the next micro-batch while the GPU works."""
    if device.type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
