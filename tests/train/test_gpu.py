"""GPU paths: torch varlen attention on packed batches, the Liger fused loss, and a bf16 training
run with stop -> checkpoint -> resume (FSDP2 over 2 GPUs when there are 2). Skipped without CUDA:
CI has no GPU; these run on the GPU machine (see BENCHMARKS.md for the command)."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from contract.protocol import EXIT_REQUEUE
from tests.faults import STOP_AT_STEP_ENV
from tests.train.run_helpers import metrics, read_log, run_training, write_run
from train.kernels.attention import PACKED_BACKENDS, setup_attention
from train.engine.checkpoint import MARKER
from train.dataset.packing import collate_packed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")

# cuBLAS is reproducible run to run only with a fixed workspace (CUDA docs, "Results reproducibility").
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
GPU_ARCH = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
            "tie_word_embeddings": False}


def _backend_or_skip(backend: str) -> str:
    registered, _, unavailable = PACKED_BACKENDS[backend]
    reason = unavailable(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    return setup_attention(backend, torch.device("cuda"), packed=True)


@pytest.mark.parametrize("backend", ["varlen", "fa4", "flash_attn"])
def test_packed_matches_per_document_forward(backend):
    name = _backend_or_skip(backend)
    torch.manual_seed(0)
    config = LlamaConfig(**GPU_ARCH)
    config._attn_implementation = name
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (37, 120, 5, 64)]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    inputs = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        packed = model(**inputs).logits[0].float()
        model.set_attn_implementation("sdpa")
        separate = torch.cat([model(input_ids=torch.tensor([d], device="cuda")).logits[0] for d in docs]).float()
    torch.testing.assert_close(packed, separate, rtol=3e-2, atol=3e-2)


def _packed_qkv(head_dim: int, lengths=(700, 33, 2048, 1, 511)):
    torch.manual_seed(0)
    total = sum(lengths)
    q = torch.randn(total, 16, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, 4, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, 4, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    return q, k, v, cu, max(lengths)


def _sdpa_per_document(q, k, v, cu):
    """fp32 reference: causal sdpa on each document separately (GQA by repeating KV heads)."""
    outs = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qd, kd, vd = (t[start:end].float().transpose(0, 1) for t in (q, k, v))
        repeat = qd.shape[0] // kd.shape[0]
        kd, vd = kd.repeat_interleave(repeat, 0), vd.repeat_interleave(repeat, 0)
        outs.append(torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("compiled", [False, True])
def test_fa4_forward_and_backward_match_reference(head_dim, compiled):
    """FA4 through our custom op (eager and inside torch.compile) against an fp32 per-document
    reference: outputs and the gradients of q, k, v."""
    _backend_or_skip("fa4")
    from train.kernels.fa4 import fa4_varlen_attention

    q, k, v, cu, longest = _packed_qkv(head_dim)
    attention = torch.compile(fa4_varlen_attention, dynamic=True) if compiled else fa4_varlen_attention
    out = attention(q, k, v, cu, cu, longest, longest, None)
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    ref = _sdpa_per_document(q, k, v, cu)
    rq, rk, rv = torch.autograd.grad(ref, (q, k, v), grad.float())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("backend", ["fused", "liger"])
def test_fused_loss_kernels_match_dense_value_and_grads(backend):
    if backend == "liger":
        pytest.importorskip("liger_kernel", reason="liger-kernel not installed")
    from train.kernels.loss import linear_cross_entropy_sum

    torch.manual_seed(0)
    hidden = torch.randn(1, 9000, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # 3 chunks
    weight = (torch.randn(32000, 256, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()  # logits ~ N(0, 1)
    labels = torch.randint(0, 32000, (1, 9000), device="cuda")
    labels[0, ::5] = -100
    dense = linear_cross_entropy_sum(hidden.float(), weight.float(), labels, backend="dense")
    want = torch.autograd.grad(dense / 7000, [hidden, weight])
    fused = linear_cross_entropy_sum(hidden, weight, labels, backend=backend)
    got = torch.autograd.grad(fused / 7000, [hidden, weight])
    torch.testing.assert_close(fused.float(), dense, rtol=1e-2, atol=1e-2)
    for g, w in zip(got, want):  # bf16 gradients against fp32: relative error of the whole tensor
        assert ((g.float() - w.float()).norm() / w.float().norm()).item() < 2e-2


def test_quack_cross_entropy_pass_matches_the_eager_pass():
    """The fused loss's softmax/gradient pass on Hopper/Blackwell (quack's kernel, gradient written over
    the logits) against the eager pass, on a Llama-3-sized vocabulary with ignored tokens."""
    from train.kernels import loss

    if loss.logit_grad_pass(torch.device("cuda")) != "quack":
        pytest.skip("quack's cross-entropy kernel does not run here (needs Hopper/Blackwell and quack-kernels)")
    torch.manual_seed(0)
    logits = (torch.randn(1000, 128256, device="cuda") * 2).to(torch.bfloat16)
    targets = torch.randint(0, 128256, (1000,), device="cuda")
    targets[::9] = loss.IGNORE_INDEX
    want_loss, want_grad = loss._ce_sum_and_logit_grad(logits, targets)
    got_loss, got_grad = loss._quack_ce_in_place(logits.clone(), targets)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-4, atol=1e-2)
    assert got_grad.dtype == torch.bfloat16 and not got_grad[::9].any(), "ignored tokens get no gradient"
    torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_swiglu_mlp_matches_stock_value_and_grads(compiled):
    """train/kernels/swiglu.py (quack GEMMs with SwiGLU in the epilogue) against the stock Llama MLP in fp64:
    fp32 master weights under bf16 autocast, as training runs it; an odd token count (no tile fits)."""
    from train.kernels import swiglu

    reason = swiglu.unavailable(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    x = torch.randn(3001, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weights = [(torch.randn(shape, device="cuda") * shape[1] ** -0.5).requires_grad_()
               for shape in ((512, 256), (512, 256), (256, 512))]
    grad = torch.randn(3001, 256, device="cuda", dtype=torch.bfloat16)
    mlp = torch.compile(swiglu.swiglu_mlp, dynamic=True) if compiled else swiglu.swiglu_mlp
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = mlp(x, *weights)
    got = [out, *torch.autograd.grad(out, [x, *weights], grad)]
    leaves = [t.detach().double().requires_grad_() for t in (x, *weights)]
    gate, up, down = leaves[1:]
    ref = torch.nn.functional.silu(leaves[0] @ gate.T) * (leaves[0] @ up.T) @ down.T
    want = [ref, *torch.autograd.grad(ref, leaves, grad.double())]
    assert got[0].dtype == torch.bfloat16 and [g.dtype for g in got[2:]] == [torch.float32] * 3
    for g, w in zip(got, want):  # bf16 against fp64: relative error of the whole tensor
        assert ((g.double() - w).norm() / w.norm()).item() < 1e-2


def test_fused_mlp_is_used_by_a_llama_model_and_trains_like_stock():
    """use_fused_swiglu swaps the forward of every stock MLP; the model's loss and gradients match."""
    from train.kernels import swiglu

    reason = swiglu.unavailable(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    torch.manual_seed(0)
    stock = LlamaForCausalLM(config).cuda()
    fused = LlamaForCausalLM(config).cuda()
    fused.load_state_dict(stock.state_dict())
    assert swiglu.use_fused_swiglu([layer.mlp for layer in fused.model.layers]) == 2
    ids = torch.randint(0, 1000, (1, 700), device="cuda")
    losses, grads = [], []
    for model in (stock, fused):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(model.model.layers[0].mlp.gate_proj.weight.grad)
    assert abs(losses[0] - losses[1]) < 1e-2
    assert ((grads[1] - grads[0]).norm() / grads[0].norm()).item() < 2e-2


def _bf16_run(path, backend: str, gpus: int):
    run = write_run(path, {
        "model": {"arch": GPU_ARCH, "attn_implementation": backend, "precision": "bf16"},
        "data": {"tokens_per_micro_batch": 2048},
        "train": {"max_steps": 16, "save_steps": 1000, "logging_steps": 1, "compile": True,
                  "gradient_checkpointing": True, "deterministic": True},
    }, processes=gpus)
    yaml = run / "accelerate.yaml"
    yaml.write_text(yaml.read_text().replace("mixed_precision: 'no'", "mixed_precision: 'bf16'"))
    return run


def _losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run) if "loss" in r}


@pytest.mark.parametrize("backend", ["varlen", "fa4"])
def test_bf16_training_stops_saves_and_resumes_like_an_uninterrupted_run(tmp_path, backend):
    """Stop at step 6 (exit 75 on every rank, which torchrun reports as its own 1), checkpoint, resume
    in the same run directory: the resumed run ends where an uninterrupted run of the same config
    ends. With train.deterministic the two are expected bit for bit; where a kernel is not
    reproducible run to run (a second uninterrupted run differs too), the resumed run must be no
    further from the reference than that second run is."""
    from bench.suites.strategy_checks import compare_exports

    _backend_or_skip(backend)
    gpus = 2 if torch.cuda.device_count() >= 2 else 1
    reference = _bf16_run(tmp_path / "reference", backend, gpus)
    assert run_training(reference, DETERMINISTIC_ENV, timeout=400) == 0, read_log(reference)

    run = _bf16_run(tmp_path / "run", backend, gpus)
    first = run_training(run, {**DETERMINISTIC_ENV, STOP_AT_STEP_ENV: "6"}, timeout=400)
    log = read_log(run)
    assert first == 1 and set(re.findall(r"exitcode\s*: (-?\d+)", log)) == {str(EXIT_REQUEUE)}, log
    assert (run / "checkpoints" / "step-00000006" / MARKER).exists(), log
    assert not (run / "export").exists()
    assert run_training(run, DETERMINISTIC_ENV, timeout=400, log_name="resume.log") == 0, read_log(run, "resume.log")
    log = read_log(run, "resume.log")
    assert f"attention: {backend} for packed batches" in log and "(step 6," in log
    if gpus == 2:
        assert "FSDP" in log
    records = [r for r in metrics(run) if "loss" in r]
    assert records[-1]["step"] == 16 and records[-1]["peak_mem_gib"] > 0

    bitwise, worst = compare_exports(reference / "export", run / "export")
    if not bitwise:
        control = _bf16_run(tmp_path / "control", backend, gpus)
        assert run_training(control, DETERMINISTIC_ENV, timeout=400) == 0, read_log(control)
        control_bitwise, noise = compare_exports(reference / "export", control / "export")
        assert not control_bitwise, f"resumed run differs from the uninterrupted one by up to {worst}"
        assert worst <= 10 * noise, f"resumed run differs by {worst}, two uninterrupted runs by {noise}"
    resumed, want = _losses(run), _losses(reference)
    assert resumed.keys() >= set(range(7, 17)) and all(resumed[s] == pytest.approx(want[s], rel=2e-2)
                                                        for s in range(7, 17)), (resumed, want)


def test_async_save_staging_pins_once_and_copies_cuda_tensors_every_save():
    """train/persist/snapshot.py's CpuStager on a GPU: pinned buffers allocated at the first stage and
    reused (torch 2.11's DefaultStager raised KeyError at its second pinned stage on the H200 image), and
    each stage holds the values of its own step."""
    from train.persist.snapshot import CpuStager

    state = {"model": {"w": torch.randn(1024, 1024, device="cuda"), "step": torch.tensor(1, device="cuda")},
             "groups": [{"lr": 1.0}]}
    stager = CpuStager(pin=True)
    first = stager.stage(state)
    assert first["model"]["w"].is_pinned() and first["model"]["w"].device.type == "cpu"
    assert torch.equal(first["model"]["w"], state["model"]["w"].cpu())
    pointer = first["model"]["w"].data_ptr()
    state["model"]["w"].add_(1)
    second = stager.stage(state)
    assert second["model"]["w"].data_ptr() == pointer
    assert torch.equal(second["model"]["w"], state["model"]["w"].cpu())
    stager.close()
