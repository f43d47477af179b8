"""Attention backends: packed forward == per-document forward on CPU; refusals carry a reason."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from contract.schema import ConfigError
from train.kernels.attention import (
    PACKED_BACKENDS,
    PACKED_SDPA,
    block_causal_mask,
    document_ids,
    register_backends,
    setup_attention,
    torch_varlen_options,
)
from train.dataset.packing import collate_packed

DOC_LENGTHS = (5, 11, 1, 8)


def packed_and_reference_logits(config, backend: str, reference: str, use_cu_seq_lens: bool = True):
    torch.manual_seed(0)
    config._attn_implementation = backend
    model = LlamaForCausalLM(config).eval()
    docs = [torch.randint(0, config.vocab_size, (n,)).tolist() for n in DOC_LENGTHS]
    batch = collate_packed([{"input_ids": d, "labels": d} for d in docs])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    if not use_cu_seq_lens:  # only position_ids tell where documents start
        inputs = {"input_ids": inputs["input_ids"], "position_ids": inputs["position_ids"]}
    with torch.no_grad():
        packed = model(**inputs).logits[0]
        model.set_attn_implementation(reference)
        separate = torch.cat([model(input_ids=torch.tensor([d])).logits[0] for d in docs])
    return packed, separate


@pytest.mark.parametrize("reference", ["sdpa", "eager"])
def test_packed_sdpa_matches_per_document_forward(tiny_model_config, reference):
    name = setup_attention("sdpa", "cpu", packed=True)
    assert name == PACKED_SDPA
    packed, separate = packed_and_reference_logits(tiny_model_config, name, reference)
    torch.testing.assert_close(packed, separate, atol=1e-5, rtol=1e-5)


def test_packed_sdpa_from_position_ids_alone(tiny_model_config):
    packed, separate = packed_and_reference_logits(tiny_model_config, PACKED_SDPA, "sdpa", use_cu_seq_lens=False)
    torch.testing.assert_close(packed, separate, atol=1e-5, rtol=1e-5)


def test_gqa_config_is_exercised(tiny_model_config):
    assert tiny_model_config.num_key_value_heads < tiny_model_config.num_attention_heads


def test_auto_picks_packed_sdpa_on_cpu():
    assert setup_attention("auto", "cpu", packed=True) == PACKED_SDPA
    assert setup_attention("auto", "cpu", packed=False) == "sdpa"
    assert setup_attention("eager", "cpu", packed=False) == "eager"


@pytest.mark.parametrize(
    ("requested", "packed", "reason"),
    [
        ("varlen", True, "runs only on CUDA"),
        ("flash_attn", True, "flash_attn"),
        ("fa4", True, "runs only on CUDA"),
        ("fa4", False, "needs packed batches"),
        ("eager", True, "cannot keep packed documents apart"),
        ("varlen", False, "needs packed batches"),
        ("bogus", True, "unknown backend"),
    ],
)
def test_backends_that_cannot_run_refuse_with_a_reason(requested, packed, reason):
    with pytest.raises(ConfigError, match=reason) as info:
        setup_attention(requested, "cpu", packed=packed)
    assert str(info.value).startswith("model.attn_implementation:")
    assert "\n" not in str(info.value)


def test_block_causal_mask_from_cu_seq_lens():
    ids = document_ids({"cu_seq_lens_q": torch.tensor([0, 2, 5], dtype=torch.int32)}, 1, 5, torch.device("cpu"))
    assert ids.tolist() == [[0, 0, 1, 1, 1]]
    mask = block_causal_mask(ids)[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]


def test_torch_varlen_signature_detection():
    v210 = {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal", "return_aux"}
    v211 = {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "return_aux", "scale", "window_size"}
    v212 = v211 | {"enable_gqa"}
    assert torch_varlen_options(v210, 0.125, 64, gqa=True) == {"is_causal": True}
    assert torch_varlen_options(v211, 0.125, 64, gqa=True) == {"window_size": (-1, 0), "scale": 0.125}
    assert torch_varlen_options(v212, 0.125, 64, gqa=True) == {
        "window_size": (-1, 0), "scale": 0.125, "enable_gqa": True
    }
    with pytest.raises(ValueError, match="no `scale`"):
        torch_varlen_options(v210, 0.5, 64, gqa=False)


@pytest.mark.parametrize("backend", sorted(PACKED_BACKENDS))
def test_every_registered_backend_builds_a_model_through_transformers(tiny_model_config, tmp_path, backend):
    """transformers 5 treats a name containing "flash" as a hub kernel to import (the model build
    then fails), "sdpa"/"flex" as its own implementations; each registered name must build, both
    from a config and from a saved checkpoint, as train.engine.model.build_model does."""
    from transformers import AutoModelForCausalLM
    from transformers.utils.generic import is_flash_attention_requested

    register_backends()
    registered = PACKED_BACKENDS[backend][0]
    assert not is_flash_attention_requested(requested_attention_implementation=registered)
    assert not any(word in registered for word in ("flash", "sdpa", "flex"))
    model = AutoModelForCausalLM.from_config(tiny_model_config, attn_implementation=registered)
    assert model.config._attn_implementation == registered
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=registered)
    assert loaded.config._attn_implementation == registered


def test_fa4_op_is_opaque_to_tracing():
    """The FA4 kernels sit behind torch.library custom ops with fake implementations, so
    torch.compile (FakeTensor tracing) sees one call with the right shapes and never enters the
    CuTe DSL launcher. Checked on CPU with fake tensors; the kernels themselves run in test_gpu."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from train.kernels.fa4 import fa4_varlen_bwd, fa4_varlen_fwd

    with FakeTensorMode():
        q, k, v = torch.empty(10, 4, 64), torch.empty(10, 2, 64), torch.empty(10, 2, 64)
        cu = torch.tensor([0, 4, 10], dtype=torch.int32)
        out, lse = fa4_varlen_fwd(q, k, v, cu, cu, 6, 6, 0.125)
        assert out.shape == (10, 4, 64) and lse.shape == (4, 10) and lse.dtype == torch.float32
        dq, dk, dv = fa4_varlen_bwd(out, q, k, v, out, lse, cu, cu, 6, 6, 0.125, False)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


@pytest.mark.parametrize("longest, launched", [(96, 512), (511, 512), (512, 512), (3000, 3000)])
def test_fa4_is_launched_with_a_floored_max_length(monkeypatch, longest, launched):
    """A pack of only short documents (the longest fitting one FA4 tile) made FA4 JIT-compile another
    kernel variant mid-run, on one rank. The ops launch FA4 with the max length floored above every tile
    size, forward and backward, and a longer real max passes through unchanged. The floor sits inside the
    ops (the traced graph carries the real length: tests/train/test_fa4_trace.py). flash-attn-4 cannot run
    on a CPU: a stand-in interface records the launch arguments, and the ops' own functions are called."""
    from types import SimpleNamespace

    from train.kernels import fa4

    launches = []

    def record(*args, max_seqlen_q, max_seqlen_k, **kwargs):
        launches.append((max_seqlen_q, max_seqlen_k))
        return None, None, None

    monkeypatch.setattr(fa4, "_interface", lambda: SimpleNamespace(_flash_attn_fwd=record, _flash_attn_bwd=record))
    t, cu = torch.empty(100, 4, 64), torch.tensor([0, 40, 100], dtype=torch.int32)
    fa4.fa4_varlen_fwd._init_fn(t, t, t, cu, cu, longest, longest, 0.125)
    fa4.fa4_varlen_bwd._init_fn(t, t, t, t, t, t, cu, cu, longest, longest, 0.125, False)
    assert launches == [(launched, launched)] * 2


# The `flash_attn` (FA2 package) step of `auto`: no wheel of it exists for this torch and the GPU image lacks
# it, so its kernel never ran here. What can be checked on a CPU is everything around the kernel: how the
# package is detected (flash-attn-4 installs a `flash_attn` folder too, holding only `flash_attn.cute`), where
# it sits in `auto`'s order, and the arguments our wrapper hands to `flash_attn_varlen_func`. A stand-in
# package on sys.path plays the installed one; it records its call and computes nothing.
STAND_IN = '''
import torch
calls = []
def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
    calls.append(dict(q=q, k=k, v=v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, max_q=max_seqlen_q,
                      max_k=max_seqlen_k, **kwargs))
    return torch.zeros_like(q)
'''


@pytest.fixture
def flash_attn_stand_in(tmp_path, monkeypatch):
    """A folder on sys.path with a `flash_attn` package laid out like flash-attn-4's (cute only); the
    returned function adds FA2's interface module to it."""
    import importlib
    import sys

    package = tmp_path / "flash_attn"
    (package / "cute").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cute" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)

    def install_fa2():
        (package / "flash_attn_interface.py").write_text(STAND_IN)
        (package / "__init__.py").write_text("from flash_attn.flash_attn_interface import flash_attn_varlen_func\n")
        importlib.invalidate_caches()
        return importlib.import_module("flash_attn.flash_attn_interface")

    yield install_fa2
    for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
        del sys.modules[name]


def test_flash_attn_detection_tells_fa2_from_flash_attn_4s_folder(flash_attn_stand_in):
    from train.kernels.attention import flash_attn_unavailable

    assert "not installed" in flash_attn_unavailable(torch.device("cpu"))  # only flash_attn.cute: not FA2
    flash_attn_stand_in()
    assert "runs only on CUDA" in flash_attn_unavailable(torch.device("cpu"))  # found; the device check is next


def test_auto_tries_flash_attn_after_fa4_and_before_torch_varlen(caplog):
    with caplog.at_level("INFO", logger="train.kernels.attention"):
        assert setup_attention("auto", "cpu", packed=True) == PACKED_SDPA
    line = next(r.getMessage() for r in caplog.records if "for packed batches" in r.getMessage())
    order = [line.index(f"not {name}:") for name in ("fa4", "flash_attn", "varlen")]
    assert order == sorted(order), line


def test_flash_attn_wrapper_hands_fa2_packed_causal_gqa_inputs(flash_attn_stand_in):
    calls = flash_attn_stand_in().calls
    _, attention, _ = PACKED_BACKENDS["flash_attn"]
    lengths = (5, 11, 1)
    total, heads, kv_heads, head_dim = sum(lengths), 4, 2, 8
    query = torch.randn(1, heads, total, head_dim, dtype=torch.bfloat16)
    key, value = (torch.randn(1, kv_heads, total, head_dim, dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, 5, 16, 17])
    out, weights = attention(None, query, key, value, None, dropout=0.0, scaling=0.3, cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu, max_length_q=11, max_length_k=11)
    (call,) = calls
    assert call["q"].shape == (total, heads, head_dim) and call["k"].shape == (total, kv_heads, head_dim)  # GQA as is
    torch.testing.assert_close(call["q"], query[0].transpose(0, 1))
    assert call["cu_q"].dtype == torch.int32 and call["cu_q"].tolist() == [0, 5, 16, 17]
    assert (call["max_q"], call["max_k"]) == (11, 11)
    assert call["causal"] is True and call["softmax_scale"] == 0.3 and call["dropout_p"] == 0.0
    assert out.shape == (1, total, heads, head_dim) and weights is None


def test_flash_attn_and_torch_varlen_are_handed_the_window(flash_attn_stand_in):
    """transformers' sliding window W (a query sees itself and W - 1 keys before it) as FlashAttention's
    window_size (W - 1, 0); no window: (-1, 0), causal. torch's varlen_attn before 2.11 has no window_size."""
    calls = flash_attn_stand_in().calls
    _, attention, _ = PACKED_BACKENDS["flash_attn"]
    query = torch.randn(1, 4, 17, 8, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5, 16, 17])
    for window in (6, None):
        attention(None, query, query, query, None, scaling=0.3, sliding_window=window, cu_seq_lens_q=cu,
                  max_length_q=11)
    assert [call["window_size"] for call in calls] == [(5, 0), (-1, 0)]
    v211 = {"window_size", "scale"}
    assert torch_varlen_options(v211, 0.125, 64, gqa=False, window=6)["window_size"] == (5, 0)
    with pytest.raises(ValueError, match="no window_size"):
        torch_varlen_options({"is_causal"}, 0.125, 64, gqa=False, window=6)
