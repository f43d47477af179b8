"""The fused-loss forward gives the stock loss and gradients (packed batch, num_items_in_batch)."""

import copy

import torch
from transformers import LlamaForCausalLM

from train.dataset.packing import collate_packed
from train.kernels.perf import use_fused_loss


def _packed_batch(vocab: int) -> dict:
    g = torch.Generator().manual_seed(0)
    docs = []
    for n in (7, 12, 5):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        labels = list(ids)
        labels[:2] = [-100, -100]  # a prompt without loss
        docs.append({"input_ids": ids, "labels": labels})
    return collate_packed(docs)


def test_fused_loss_matches_stock_loss_and_grads(tiny_model_config):
    torch.manual_seed(0)
    stock = LlamaForCausalLM(tiny_model_config).double()
    fused = copy.deepcopy(stock)
    use_fused_loss(fused)
    batch = _packed_batch(tiny_model_config.vocab_size)
    for items in (None, torch.tensor(9.0, dtype=torch.float64)):
        ref = stock(**batch, num_items_in_batch=items).loss
        got = fused(**batch, num_items_in_batch=items).loss
        torch.testing.assert_close(got, ref)
    ref.backward()
    got.backward()
    for (name, a), (_, b) in zip(stock.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_fused_forward_without_labels_returns_logits(tiny_model_config):
    model = LlamaForCausalLM(tiny_model_config)
    use_fused_loss(model)
    ids = torch.randint(0, tiny_model_config.vocab_size, (1, 6))
    out = model(input_ids=ids)
    assert out.logits.shape == (1, 6, tiny_model_config.vocab_size)
    assert set(model.state_dict()) == set(LlamaForCausalLM(tiny_model_config).state_dict())


def test_one_compile_rule_for_the_model_and_the_packer(monkeypatch):
    """train.compile: true always, false never, auto on CUDA except QLoRA over several ranks. The
    model build and the loop's fixed-length rows both read this one rule."""
    from contract.config import TrainConfig
    from train.kernels.perf import compiles_decoder_layers

    cfg = TrainConfig()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rule on a GPU node
    assert compiles_decoder_layers(cfg, 4)
    cfg.train.compile = False
    assert not compiles_decoder_layers(cfg, 1)
    cfg.train.compile, cfg.lora.enabled, cfg.lora.quant = "auto", True, "nf4"
    assert compiles_decoder_layers(cfg, 1) and not compiles_decoder_layers(cfg, 2)
    cfg.train.compile = True
    assert compiles_decoder_layers(cfg, 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg.train.compile, cfg.lora.quant = "auto", "none"
    assert not compiles_decoder_layers(cfg, 1)


def test_garbage_is_collected_at_step_boundaries_only_and_timed():
    """train.gc_every_steps: no automatic collection while training, a young-generation one every N steps,
    Python's own setting back afterwards; the seconds go to metrics.jsonl's gc_s."""
    import gc

    from train.kernels.perf import StepGarbageCollector

    assert gc.isenabled()
    collector = StepGarbageCollector(every_steps=3)
    with collector:
        assert not gc.isenabled()
        before = gc.get_stats()[1]["collections"]
        for step in range(1, 7):
            collector.after_step(step)
        assert gc.get_stats()[1]["collections"] - before == 2  # steps 3 and 6
        assert collector.take_seconds() > 0 and collector.take_seconds() == 0.0
    assert gc.isenabled()


def test_a_collection_in_a_saves_pause_starts_the_count_again_and_a_resumed_run_counts_from_its_start():
    """The loop collects right after a save (training is paused there anyway); the next collection then
    comes N steps after it, not at the next multiple of N. A run resumed at step 7 counts from step 7."""
    import gc

    from train.kernels.perf import StepGarbageCollector

    def collections_at(steps: range, save_at: int | None) -> list[int]:
        collected = []
        collector = StepGarbageCollector(every_steps=5)
        with collector:
            for step in steps:
                before = gc.get_stats()[1]["collections"]
                collector.after_step(step)
                if step == save_at:
                    collector.collect(step)
                if gc.get_stats()[1]["collections"] > before:
                    collected.append(step)
        return collected

    assert collections_at(range(1, 16), save_at=None) == [5, 10, 15]
    assert collections_at(range(1, 16), save_at=7) == [5, 7, 12]
    assert collections_at(range(8, 20), save_at=None) == [12, 17]


def test_gc_every_steps_0_leaves_pythons_automatic_collection_and_times_it():
    import gc

    from train.kernels.perf import StepGarbageCollector

    collector = StepGarbageCollector(every_steps=0)
    callbacks = len(gc.callbacks)
    with collector:
        assert gc.isenabled()
        collector.after_step(50)
        gc.collect(0)  # stands for an automatic collection: the callback times it the same way
        assert collector.take_seconds() > 0
    assert len(gc.callbacks) == callbacks


def test_the_step_clock_names_each_windows_slowest_step_and_leaves_pauses_out():
    """On the CPU the host clock times a step; a pause between spans (a save after a settle) is no step's."""
    import time

    from train.observe.metrics import StepClock

    clock = StepClock()
    assert not clock.cuda  # CPU here: the host clock; on a GPU, events on the compute stream
    for step, seconds in ((1, 0.01), (2, 0.1), (3, 0.01)):
        clock.before_step()
        time.sleep(seconds)
        clock.after_step(step)
    clock.settle()
    time.sleep(0.5)  # a save: not part of step 4
    clock.before_step()
    time.sleep(0.01)
    clock.after_step(4)
    clock.settle()
    assert clock.slowest_step == 2 and 0.1 <= clock.slowest_s < 0.5
