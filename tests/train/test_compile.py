"""torch.compile of the decoder layers on the GPU attention path: one graph for every pack shape.

A recompilation in the middle of a run stalls every rank for as long as compiling a layer takes
(seconds for an 8B layer), so packs of any number of documents and any lengths, a single document
included, must reuse the first graph. The FlashAttention kernels behind torch's `varlen_attn` exist
only on CUDA; here they are stood in for by per-document sdpa on the CPU, registered as the CPU
kernels of the same custom ops, so the traced graph is the GPU path's.
"""

from __future__ import annotations

import concurrent.futures
import random

import pytest
import torch
import torch.nn.functional as F

from tests.train.conftest import TINY_ARCH

varlen = pytest.importorskip("torch.nn.attention.varlen", reason="torch varlen_attn needs torch >= 2.10")


def _per_document_attention(q, k, v, cu_q, cu_k, scale):
    outs = []
    for i in range(cu_q.numel() - 1):
        rows, cols = slice(int(cu_q[i]), int(cu_q[i + 1])), slice(int(cu_k[i]), int(cu_k[i + 1]))
        qi, ki, vi = (t.transpose(0, 1).unsqueeze(0).float() for t in (q[rows], k[cols], v[cols]))
        out = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=True)
        outs.append(out[0].transpose(0, 1).to(q.dtype))
    return torch.cat(outs)


def _cpu_forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None,
                 window_size=None, enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    out = _per_document_attention(query, key, value, cu_seq_q, cu_seq_k if cu_seq_k is not None else cu_seq_q, scale)
    return out, torch.zeros(query.size(1), query.size(0)), torch.zeros(2, dtype=torch.uint64)


def _cpu_backward(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, rng_state,
                  scale=None, window_size=None):
    def grads():  # in a fresh thread: this kernel runs below autograd, whose exclusion is thread-local
        q, k, v = (t.detach().requires_grad_() for t in (query, key, value))
        return torch.autograd.grad(_per_document_attention(q, k, v, cu_seq_q, cu_seq_k, scale), (q, k, v), grad_out)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(grads).result()


@pytest.fixture
def varlen_on_cpu():
    ops = {varlen._varlen_attn: _cpu_forward, varlen._varlen_attn_backward: _cpu_backward}
    for op, kernel in ops.items():
        op.register_kernel("cpu")(kernel)
    torch._dynamo.reset()
    yield
    for op in ops:
        op.set_kernel_enabled("cpu", False)
    torch._dynamo.reset()


def _random_pack(rng: random.Random, documents: int) -> dict:
    from train.dataset.packing import collate_packed

    lengths = [rng.randint(2, 100) for _ in range(documents)]
    return collate_packed([{"input_ids": [rng.randrange(512) for _ in range(n)],
                            "labels": [rng.randrange(512) for _ in range(n)]} for n in lengths])


def test_compiled_layers_keep_one_graph_across_pack_shapes(varlen_on_cpu):
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM

    from train.kernels.attention import TORCH_VARLEN, register_backends
    from train.kernels.perf import compile_decoder_layers, compiled_graphs, use_fused_loss

    register_backends()
    arch = {**TINY_ARCH, "num_hidden_layers": 3}
    model = LlamaForCausalLM(LlamaConfig(**arch, attn_implementation=TORCH_VARLEN, use_cache=False)).to(torch.bfloat16)
    use_fused_loss(model)
    compile_decoder_layers(model)
    counters.clear()
    rng = random.Random(0)
    for documents in [4, 2, 1, 6, 1, 3, 5, 1, 2]:  # single-document packs between multi-document ones
        model(**_random_pack(rng, documents)).loss.backward()
    assert compiled_graphs() == 1, "a pack shape recompiled the decoder layers"
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_recompile_watch_warns_only_for_graphs_after_the_first_window(caplog):
    from train.kernels.perf import RecompileWatch

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager")
    watch = RecompileWatch()
    double(torch.ones(3))
    first = watch.check(step=1)  # the first window's compilation is expected
    double(torch.ones(5))  # new size: dynamo marks the dimension dynamic, i.e. a second graph
    double(torch.ones(7))  # covered by the dynamic graph
    with caplog.at_level("WARNING", logger="train.kernels.perf"):
        assert watch.check(step=2) == first + 1
        assert watch.check(step=3) == first + 1
    # Only our logger's records: torch's own loggers (e.g. torch.__trace) add records of their own under pytest >= 9.2.
    ours = [r.getMessage()[:45] for r in caplog.records if r.name == "train.kernels.perf"]
    assert ours == ["torch.compile captured 1 new graph(s) before "]
    torch._dynamo.reset()


def test_fixed_length_packs_give_the_compiled_layers_one_shape(varlen_on_cpu):
    """With compiled layers the loop fills every pack up to the budget (train/dataset/packing.py), so
    packs of varying real length reach the layers as one shape: one graph after the first step."""
    from torch._dynamo.utils import counters
    from transformers import LlamaConfig, LlamaForCausalLM

    from train.dataset.packing import collate
    from train.kernels.attention import TORCH_VARLEN, register_backends
    from train.kernels.perf import compile_decoder_layers, compiled_graphs, use_fused_loss

    register_backends()
    model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH, attn_implementation=TORCH_VARLEN, use_cache=False))
    model = model.to(torch.bfloat16)
    use_fused_loss(model)
    compile_decoder_layers(model)
    counters.clear()
    rng, shapes, first = random.Random(1), set(), None
    for documents in [3, 1, 5, 2, 4, 1]:
        tokens = [[rng.randrange(512) for _ in range(rng.randint(2, 60))] for _ in range(documents)]
        examples = [{"input_ids": t, "labels": t} for t in tokens]
        batch = collate(examples, packed=True, pad_id=0, fixed_length=320)
        shapes.add(tuple(batch["input_ids"].shape))
        model(**batch).loss.backward()
        first = compiled_graphs() if first is None else first
    assert shapes == {(1, 320)}
    assert compiled_graphs() == first == 1, "a fixed-length pack recompiled the decoder layers"


def test_compiled_run_counts_the_same_tokens_as_an_eager_one(tmp_path):
    """A 2-rank FSDP2 run with compiled layers (fixed-length rows) reports the eager run's tokens and
    packing efficiency (the filler is never counted), trains to the same losses, and compiles no graph
    after its first logged window."""
    from tests.train.run_helpers import metrics, read_log, run_training, write_run

    records, done = {}, {}
    for compiled in (False, True):
        run_dir = write_run(tmp_path / f"compile-{compiled}", {
            "train": {"compile": compiled, "max_steps": 4, "logging_steps": 2, "gradient_checkpointing": False}})
        assert run_training(run_dir, timeout=600) == 0, read_log(run_dir)[-3000:]
        records[compiled] = [r for r in metrics(run_dir) if "loss" in r and "packing_efficiency" in r]
        done[compiled] = next(r for r in metrics(run_dir) if r.get("event") == "done")
    assert "filled up to 256 tokens" in read_log(tmp_path / "compile-True")
    assert "filled up to" not in read_log(tmp_path / "compile-False")
    eager, compiled = records[False], records[True]
    assert len(compiled) == len(eager) == 2
    assert done[True]["tokens_seen"] == done[False]["tokens_seen"]
    assert [r["packing_efficiency"] for r in compiled] == [r["packing_efficiency"] for r in eager]
    assert all(r["packing_efficiency"] < 1.0 for r in compiled)  # real tokens / slots, not the filled rows
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=1e-4)
    assert compiled[-1]["compiled_graphs"] == compiled[0]["compiled_graphs"] > 0


def test_compiled_layers_stay_checkpointed_once_fsdp2_has_wrapped_them(tmp_path):
    """transformers checkpoints inside each decoder layer's class `forward`, and only while that wrapper is
    the class's outermost `forward`; fully_shard gives the layer a subclass that wraps it once more. Compiled
    layers must still be checkpointed after that swap (a compiled bound wrapper was not: every layer kept its
    whole saved set, and llama-70b QLoRA ran out of memory on one H100): what autograd saves outside the
    checkpoints is the same with compiled layers as with eager ones (embedding, final norm, loss), and less
    than without checkpointing. With train.checkpoint_layers = 1 (of 2), the compiled layer left out keeps its
    saved set and the other stays checkpointed: more than all checkpointed, less than none."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from contract.config import ALL_LAYERS, TrainSection
    from train.kernels.perf import compile_decoder_layers, enable_checkpointing

    ids = torch.randint(0, TINY_ARCH["vocab_size"], (1, 64), generator=torch.Generator().manual_seed(0))

    def saved_outside_checkpoints(compiled: bool, layers: int | str | None = ALL_LAYERS) -> int:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**TINY_ARCH, attn_implementation="sdpa", use_cache=False))
        if layers is not None:  # as build_model does
            enable_checkpointing(model, TrainSection(checkpoint_layers=layers))
        if compiled:
            compile_decoder_layers(model)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        assert all(type(layer).__name__.startswith("FSDP") for layer in model.model.layers)
        sizes: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            model(input_ids=ids, labels=ids)  # the forward's saved set is the question; no backward compiled
        return sum(sizes)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    torch._dynamo.reset()
    try:
        eager, compiled = saved_outside_checkpoints(False), saved_outside_checkpoints(True)
        compiled_one = saved_outside_checkpoints(True, layers=1)
        unchecked = saved_outside_checkpoints(False, layers=None)
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    assert compiled == eager < compiled_one < unchecked, (compiled, eager, compiled_one, unchecked)
