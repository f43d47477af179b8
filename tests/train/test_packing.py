"""Packing: best-fit-decreasing plan properties, packed collate fields, no label leak across documents."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaForCausalLM

from train.kernels.attention import setup_attention
from train.dataset.packing import (
    IGNORE_INDEX,
    collate,
    collate_packed,
    collate_padded,
    count_over_budget,
    packing_efficiency,
    plan_micro_batches,
)


def random_lengths(n: int, seed: int = 0, high: int = 300) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, high) for _ in range(n)]


def test_plan_respects_budget_and_uses_every_example_once():
    lengths = random_lengths(500)
    plan = plan_micro_batches(lengths, budget=512, seed=1, epoch=0)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in mb) <= 512 for mb in plan)
    assert packing_efficiency(plan, lengths, 512) > 0.9  # BFD packs random lengths tightly


def test_plan_is_deterministic_by_seed_and_epoch():
    lengths = random_lengths(200)
    first = plan_micro_batches(lengths, 400, seed=3, epoch=0)
    assert first == plan_micro_batches(lengths, 400, seed=3, epoch=0)
    other_epoch = plan_micro_batches(lengths, 400, seed=3, epoch=1)
    assert first != other_epoch
    assert sorted(map(sorted, first)) == sorted(map(sorted, other_epoch))  # same bins, new order
    assert first != plan_micro_batches(lengths, 400, seed=4, epoch=0)


def test_best_fit_decreasing_on_a_hand_case():
    # Decreasing: 6 -> bin A, 5 -> bin B, 4 -> A (gap 4 fits exactly), 3 -> B (gap 5 -> 2), 2 -> B.
    plan = plan_micro_batches([3, 6, 2, 5, 4], budget=10, seed=0, epoch=0)
    assert sorted(map(sorted, plan)) == [[0, 2, 3], [1, 4]]


def test_over_budget_examples_get_own_bin_and_are_truncated():
    lengths = [50, 10, 3]
    plan = plan_micro_batches(lengths, budget=16, seed=0, epoch=0)
    assert count_over_budget(lengths, 16) == 1
    assert [0] in plan
    batch = collate_packed([{"input_ids": list(range(50)), "labels": list(range(50))}], budget=16)
    assert batch["input_ids"].shape == (1, 16)


def test_collate_packed_fields():
    examples = [
        {"input_ids": [1, 2, 3], "labels": [1, 2, 3]},
        {"input_ids": [4, 5], "labels": [IGNORE_INDEX, 5]},
        {"input_ids": [6, 7, 8, 9], "labels": [6, 7, 8, 9]},
    ]
    batch = collate_packed(examples)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, 7, 8, 9]]
    assert batch["cu_seq_lens_q"].dtype == torch.int32
    assert batch["cu_seq_lens_q"].tolist() == batch["cu_seq_lens_k"].tolist() == [0, 3, 5, 9]
    assert batch["max_length_q"] == batch["max_length_k"] == 4


def test_shifted_labels_never_cross_a_document_boundary():
    """Causal-LM loss pairs position t with label t+1; every such pair with a real label must lie
    inside one document, so no document is trained from the previous document's context."""
    examples = [{"input_ids": list(range(10 * d, 10 * d + n)), "labels": list(range(10 * d, 10 * d + n))}
                for d, n in enumerate([4, 1, 6, 3])]
    batch = collate_packed(examples)
    doc_of = torch.repeat_interleave(torch.arange(4), torch.tensor([4, 1, 6, 3]))
    labels = batch["labels"][0]
    for t in range(labels.numel() - 1):
        if labels[t + 1] != IGNORE_INDEX:
            assert doc_of[t] == doc_of[t + 1], f"position {t} predicts a token of the next document"


def test_packed_loss_equals_per_document_loss(tiny_model_config):
    """The model's own (shifting) loss on a packed row equals the token-weighted per-document loss."""
    torch.manual_seed(0)
    tiny_model_config._attn_implementation = setup_attention("sdpa", "cpu", packed=True)
    model = LlamaForCausalLM(tiny_model_config).eval()
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (7, 2, 12)]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    with torch.no_grad():
        packed_loss = model(**batch).loss
        model.set_attn_implementation("sdpa")
        total = sum(model(input_ids=torch.tensor([d]), labels=torch.tensor([d])).loss * (len(d) - 1) for d in docs)
    assert torch.allclose(packed_loss, total / sum(len(d) - 1 for d in docs), atol=1e-5)


def test_collate_padded():
    batch = collate_padded([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4], "labels": [4]}], 0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [4, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def _docs(*lengths: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    tokens = [[rng.randrange(1, 512) for _ in range(2 * n)] for n in lengths]
    return [{"input_ids": t[: len(t) // 2], "labels": t[len(t) // 2:]} for t in tokens]


def test_fixed_length_row_ends_with_one_filler_segment():
    examples = _docs(3, 2, 4)
    plain, fixed = collate_packed(examples), collate(examples, packed=True, pad_id=7, fixed_length=16)
    assert fixed["input_ids"].shape == fixed["labels"].shape == fixed["position_ids"].shape == (1, 16)
    assert fixed["input_ids"][0, :9].tolist() == plain["input_ids"][0].tolist()
    assert fixed["input_ids"][0, 9:].tolist() == [7] * 7
    assert fixed["labels"][0, :9].tolist() == plain["labels"][0].tolist()
    assert fixed["labels"][0, 9:].tolist() == [IGNORE_INDEX] * 7
    assert fixed["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]]
    assert fixed["cu_seq_lens_q"].dtype == torch.int32
    assert fixed["cu_seq_lens_q"].tolist() == fixed["cu_seq_lens_k"].tolist() == [0, 3, 5, 9, 16]
    assert fixed["max_length_q"] == fixed["max_length_k"] == 7  # the filler is the longest segment here
    assert int((fixed["labels"] != IGNORE_INDEX).sum()) == int((plain["labels"] != IGNORE_INDEX).sum())


def test_fixed_length_row_keeps_the_longest_document_as_max_length_and_adds_nothing_when_full():
    assert collate(_docs(10, 3), packed=True, pad_id=0, fixed_length=16)["max_length_q"] == 10
    full = collate(_docs(10, 6), packed=True, pad_id=0, fixed_length=16)
    assert full["cu_seq_lens_q"].tolist() == [0, 10, 16]  # no empty filler segment
    single = collate(_docs(40), packed=True, pad_id=0, fixed_length=16)  # over budget: truncated, as planned
    assert single["input_ids"].shape == (1, 16) and single["cu_seq_lens_q"].tolist() == [0, 16]


def test_a_row_longer_than_its_fixed_length_is_refused():
    with pytest.raises(ValueError, match="10 tokens exceeds the 8-token budget"):
        collate_packed(_docs(6, 4), pad_to=8)


def test_without_fixed_length_collate_is_the_plain_packed_row():
    examples = _docs(5, 9, 1)
    plain, via_collate = collate_packed(examples), collate(examples, packed=True, pad_id=3)
    assert plain.keys() == via_collate.keys()
    assert all(torch.equal(plain[k], via_collate[k]) if torch.is_tensor(plain[k]) else plain[k] == via_collate[k]
               for k in plain)


@pytest.mark.parametrize("fused", [False, True])
def test_filler_changes_neither_loss_nor_gradients(tiny_model_config, fused):
    """The same micro-batch with and without the filler, through the packed CPU attention path
    (block-diagonal sdpa from cu_seq_lens): same loss, same gradients (fp32)."""
    from train.kernels.perf import use_fused_loss

    torch.manual_seed(0)
    tiny_model_config._attn_implementation = setup_attention("sdpa", "cpu", packed=True)
    model = LlamaForCausalLM(tiny_model_config)
    if fused:
        use_fused_loss(model)
    examples = _docs(7, 2, 12, 5)
    results = []
    for fixed_length in (None, 64):
        model.zero_grad(set_to_none=True)
        batch = collate(examples, packed=True, pad_id=0, fixed_length=fixed_length)
        items = (batch["labels"][..., 1:] != IGNORE_INDEX).sum()
        loss = model(**batch, num_items_in_batch=items).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, grads), (filled_loss, filled_grads) = results
    assert torch.allclose(loss, filled_loss, rtol=0, atol=1e-6)
    for name, grad in grads.items():
        assert torch.allclose(grad, filled_grads[name], rtol=0, atol=1e-6), name


def test_fixed_length_batches_count_only_document_tokens():
    """The loop's token count (tokens/s, MFU, packing efficiency) is of documents, never the filler;
    an over-budget example counts as the budget it is truncated to."""
    from train.engine.loop import Batches

    examples = _docs(5, 9, 1, 30)
    lengths = [len(e["input_ids"]) for e in examples]
    batches = Batches(examples, lengths, budget=16, seed=0, packed=True, pad_id=0, fixed_length=True)
    for micro_batch in batches.plan(0):
        batch = batches.collate(micro_batch)
        assert batch["input_ids"].shape == (1, 16)
        real = sum(batches.real_lengths(micro_batch))
        assert real == int(batch["cu_seq_lens_q"][len(micro_batch)])  # where the documents end, the filler starts
        assert real == sum(min(lengths[i], 16) for i in micro_batch)
    assert sum(n for mb in batches.plan(0) for n in batches.real_lengths(mb)) == 5 + 9 + 1 + 16
    eager = Batches(examples, lengths, budget=16, seed=0, packed=True, pad_id=0)
    assert eager.row_length is None and eager.real_lengths([3]) == [30]
