"""The model trained is the model defined, per family (tests/train/families.py): our packed,
padding-free forward and backward over documents longer than the sliding window equal transformers'
`eager` run on each document alone (fp32 CPU: loss 1e-5, gradients 1e-4), sliding windows per layer type
and attention sinks included. The GPU backends' version is tests/train/test_gpu_exact.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from contract.attention import AttentionFeatures
from contract.protocol import free_port
from contract.schema import ConfigError
from tests.train.families import FAMILIES, WINDOW, family_config
from tests.train.run_helpers import REPO, launch_env
from train.dataset.packing import collate_packed
from train.kernels.attention import (PACKED_SDPA, attention_with_sinks, block_causal_mask, register_backends,
                                     setup_attention)
from train.kernels.fa4 import sink_grad, with_sinks

CP_WORKER = Path(__file__).parent / "workers" / "exact_families_cp.py"

DOC_LENGTHS = (13, 3, 9)  # two longer than the window, one shorter


def documents(vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in DOC_LENGTHS]


def token_loss_sum(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """Sum of next-token losses of one document's logits [T, V]."""
    return F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:]), reduction="sum")


def loss_and_grads(model, docs: list[list[int]], packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean next-token loss over the documents (one packed row, or each alone) and its gradients."""
    model.zero_grad()
    if packed:
        batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        bounds = batch["cu_seq_lens_q"].tolist()
        total = sum(token_loss_sum(logits[a:b], d) for a, b, d in zip(bounds, bounds[1:], docs))
    else:
        total = sum(token_loss_sum(model(input_ids=torch.tensor([d])).logits[0], d) for d in docs)
    loss = total / sum(len(d) - 1 for d in docs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def model_of(family: str, attn: str):
    torch.manual_seed(0)
    config = family_config(family)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    if hasattr(model.model.layers[0].self_attn, "sinks"):  # zero-initialised: give them values that matter
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    return model.train()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_forward_and_backward_equal_eager_per_document(family):
    register_backends()
    model = model_of(family, "eager")
    docs = documents(model.config.vocab_size)
    reference_loss, reference_grads = loss_and_grads(model, docs, packed=False)
    model.set_attn_implementation(PACKED_SDPA)
    loss, grads = loss_and_grads(model, docs, packed=True)
    torch.testing.assert_close(loss, reference_loss, atol=1e-5, rtol=0)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("family", ["mistral", "gemma3", "gpt-oss"])
def test_the_windows_change_the_function(family):
    """Guard against a vacuous test: with the window wider than every document the loss moves."""
    model = model_of(family, "eager")
    docs = documents(model.config.vocab_size)
    narrow, _ = loss_and_grads(model, docs, packed=False)
    model.config.sliding_window = 1000
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 1000
    wide, _ = loss_and_grads(model, docs, packed=False)
    assert abs(float(narrow) - float(wide)) > 1e-4


@pytest.mark.parametrize(("family", "needs"), [
    ("llama3.1", []), ("qwen2.5", []), ("qwen3", []), ("qwen3-moe", []),
    ("mistral", ["sliding window"]), ("gemma3", ["sliding window"]),
    ("gpt-oss", ["sliding window", "attention sinks"]),
])
def test_features_read_from_each_config(family, needs):
    features = AttentionFeatures.from_config(family_config(family).to_dict())
    assert [feature for feature, _ in features.needed()] == needs
    if "sliding window" in needs:
        assert set(features.windows.values()) == {WINDOW}
    assert AttentionFeatures.from_config(family_config(family).to_dict(), max_length=WINDOW).windows == {}


def test_cpu_picks_the_backend_that_computes_windows_and_sinks():
    features = AttentionFeatures.from_config(family_config("gpt-oss").to_dict())
    assert setup_attention("auto", "cpu", packed=True, features=features) == PACKED_SDPA
    assert setup_attention("auto", "cpu", packed=False, features=features) == "eager"


@pytest.mark.slow
def test_every_family_under_context_parallelism_equals_one_rank():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(CP_WORKER)], cwd=REPO, env=launch_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 2 * len(FAMILIES)


def test_fa4_sink_correction_is_exact():
    """FA4's sinks (train/kernels/fa4.py): the sink-free kernel's output and log-sum-exp, corrected, equal
    attention with sinks; FlashAttention's backward given the corrected output and log-sum-exp (written out
    here, as the kernel computes it) gives its q, k, v gradients; sink_grad gives the sinks'."""
    torch.manual_seed(0)
    heads, length, dim, scale = 4, 12, 8, 0.3
    q, k, v = (torch.randn(1, heads, length, dim, dtype=torch.float64, requires_grad=True) for _ in range(3))
    sinks = torch.randn(heads, dtype=torch.float64, requires_grad=True)
    mask = block_causal_mask(torch.tensor([[0] * 7 + [1] * 5]), window=WINDOW)
    want = attention_with_sinks(q, k, v, mask, sinks, scale, 0.0)
    dout = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v, sinks), dout)

    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, -1)[0]  # [H, T], the kernel's, without sinks
    plain = (torch.softmax(scores, -1) @ v)[0].transpose(0, 1)  # [T, H, D]
    out, lse_sink = with_sinks(plain.detach(), lse.detach(), sinks.detach())
    torch.testing.assert_close(out, want[0].transpose(0, 1).detach())
    d_out = dout[0].transpose(0, 1)
    probs = torch.exp(scores.detach()[0] - lse_sink[..., None])  # the kernel's P from the lse it is given
    row = (out * d_out).sum(-1).transpose(0, 1)[..., None]  # and its rowsum(dout * out)
    d_scores = probs * (d_out.transpose(0, 1) @ v.detach()[0].transpose(-1, -2) - row) * scale
    got = (d_scores @ k.detach()[0], d_scores.transpose(-1, -2) @ q.detach()[0],
           probs.transpose(-1, -2) @ d_out.transpose(0, 1))
    for mine, reference in zip(got, want_grads[:3]):
        torch.testing.assert_close(mine, reference[0])
    torch.testing.assert_close(sink_grad(out, d_out, lse_sink, sinks.detach()), want_grads[3])


def test_rope_stretch_reaches_gemma3s_global_layers_only():
    """Training past the context stretches RoPE (train/engine/model.py): Gemma 3's parameters are per layer
    type, so the stretch goes into the global layers' (a sliding layer's distances stay in its window),
    and the built model uses it; a model with its own scaling (Llama 3.1's llama3) is left as it is."""
    from train.engine.model import apply_rope_scaling

    config = family_config("gemma3")
    apply_rope_scaling(config, 4 * config.max_position_embeddings)
    rope = AutoModelForCausalLM.from_config(config).model.rotary_emb
    assert rope.rope_type == {"full_attention": "linear", "sliding_attention": "default"}
    assert config.rope_parameters["full_attention"]["factor"] == 4.0
    llama = family_config("llama3.1")
    apply_rope_scaling(llama, 4 * llama.max_position_embeddings)
    assert llama.rope_parameters["rope_type"] == "llama3" and llama.max_position_embeddings == 256


@pytest.mark.parametrize("backend", ["flash_attn", "varlen"])
def test_a_backend_without_sinks_is_refused_in_one_line(backend):
    features = AttentionFeatures.from_config(family_config("gpt-oss").to_dict())
    with pytest.raises(ConfigError) as error:
        setup_attention(backend, "cpu", packed=True, features=features)
    assert str(error.value) == (f"model.attn_implementation: {backend} cannot compute the model's attention sinks "
                                "(sliding_attention, full_attention layers); use fa4, sdpa")


def test_fa4_is_handed_the_window_forward_and_backward(monkeypatch):
    """transformers' window W (a query sees itself and W - 1 keys before it) reaches FA4 as window_size_left
    W - 1, right 0, in the forward and the backward; no window, no window arguments. flash-attn-4 cannot run
    on a CPU: a stand-in interface records the launch arguments (as test_attention's floor test does)."""
    from types import SimpleNamespace

    from train.kernels import fa4

    launches = []

    def record(*args, **kwargs):
        launches.append({k: v for k, v in kwargs.items() if k.startswith("window") or k == "learnable_sink"})
        return torch.zeros(100, 4, 64), torch.zeros(4, 100), None

    monkeypatch.setattr(fa4, "_interface", lambda: SimpleNamespace(_flash_attn_fwd=record, _flash_attn_bwd=record))
    t, cu = torch.empty(100, 4, 64), torch.tensor([0, 40, 100], dtype=torch.int32)
    for window in (128, -1):
        fa4.fa4_varlen_fwd._init_fn(t, t, t, cu, cu, 60, 60, 0.125, window, None)
        fa4.fa4_varlen_bwd._init_fn(t, t, t, t, t, t, cu, cu, 60, 60, 0.125, False, window)
    windowed = {"window_size_left": 127, "window_size_right": 0}
    assert launches == [windowed, windowed, {}, {}]


def test_fa4_window_on_hopper_only_where_the_installed_backward_has_it(monkeypatch):
    from types import SimpleNamespace

    from train.kernels import fa4

    def old_bwd(q, k, v, window_size_left=None, window_size_right=None):
        assert window_size_left is None and window_size_right is None, "local not supported yet on 9.x"

    def new_bwd(q, k, v, window_size_left=None, window_size_right=None):
        return q, k, v

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    monkeypatch.setattr(fa4, "_interface", lambda: SimpleNamespace(_flash_attn_bwd=old_bwd))
    assert "no sliding window on Hopper" in fa4.window_unavailable(torch.device("cuda"))
    monkeypatch.setattr(fa4, "_interface", lambda: SimpleNamespace(_flash_attn_bwd=new_bwd))
    assert fa4.window_unavailable(torch.device("cuda")) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))  # a B200
    monkeypatch.setattr(fa4, "_interface", lambda: SimpleNamespace(_flash_attn_bwd=old_bwd))
    assert fa4.window_unavailable(torch.device("cuda")) is None
