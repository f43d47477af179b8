"""Sliding windows and attention sinks on the GPU backends (FA4, FlashAttention-2, torch varlen), each where
contract/attention.py says it computes them: the kernel through our transformers attention function
against the fp32 block-diagonal path (tests/train/test_exact_families.py proves that equal to transformers'
eager), outputs and gradients (the sinks' included); then every family of tests/train/families.py, its
packed bf16 forward and backward against the fp32 one. A backend that cannot compute a feature is refused
by setup_attention in one line (checked here too). Skipped without CUDA (CI has no GPU)."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from contract.attention import AttentionFeatures, feature_blocker
from contract.protocol import free_port
from contract.schema import ConfigError
from tests.train.families import FAMILIES, SPECS, family_config
from tests.train.run_helpers import REPO, launch_env
from train.dataset.packing import collate_packed
from train.kernels.attention import PACKED_BACKENDS, PACKED_SDPA, packed_sdpa_forward, setup_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on CI)")
GPU_BACKENDS = ("fa4", "flash_attn", "varlen")
CUDA = torch.device("cuda")
CP_WORKER = Path(__file__).parent / "workers" / "exact_families_cp.py"


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


def _registered_or_skip(backend: str, features: AttentionFeatures) -> str:
    """The registered function's name; skipped where the kernel is not installed; where the contract says the
    backend cannot compute a feature, setup_attention must refuse it in one line (then skipped)."""
    reason = PACKED_BACKENDS[backend][2](CUDA)
    if reason:
        pytest.skip(reason)
    if blocker := feature_blocker(backend, features):
        with pytest.raises(ConfigError, match="cannot compute"):
            setup_attention(backend, CUDA, packed=True, features=features)
        pytest.skip(blocker)
    try:
        return setup_attention(backend, CUDA, packed=True, features=features)
    except ConfigError as error:  # this installed kernel lacks the feature (FA4's Hopper window on old versions)
        pytest.skip(str(error))


def _packed_kwargs(lengths: tuple[int, ...]) -> dict:
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device=CUDA, dtype=torch.int32)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths), "max_length_k": max(lengths)}


@pytest.mark.parametrize("sinks", [False, True], ids=["no-sinks", "sinks"])
@pytest.mark.parametrize("window", [None, 64, 700], ids=["causal", "window64", "window700"])
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_kernel_window_and_sinks_match_the_fp32_path(backend, window, sinks):
    features = AttentionFeatures({"sliding_attention": window} if window else {},
                                 ("sliding_attention",) if sinks else ())
    name = _registered_or_skip(backend, features)
    function = PACKED_BACKENDS[backend][1]
    assert PACKED_BACKENDS[backend][0] == name
    torch.manual_seed(0)
    lengths = (700, 33, 1000, 1, 300)
    total = sum(lengths)
    q = torch.randn(1, 16, total, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(1, 4, total, 64, device=CUDA, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    s_aux = torch.randn(16, device=CUDA, requires_grad=True) if sinks else None
    kwargs = dict(dropout=0.0, scaling=0.125, sliding_window=window, s_aux=s_aux, **_packed_kwargs(lengths))
    out, _ = function(None, q, k, v, None, **kwargs)
    want, _ = packed_sdpa_forward(None, q.float(), k.float(), v.float(), None, **kwargs)
    dout = torch.randn_like(want)
    inputs = (q, k, v, s_aux) if sinks else (q, k, v)
    got_grads = torch.autograd.grad(out.float(), inputs, dout)
    want_grads = torch.autograd.grad(want, inputs, dout)
    assert _relative_error(out, want) < 1e-2
    for label, got, expected in zip("q k v sinks".split(), got_grads, want_grads):
        assert _relative_error(got, expected) < 2e-2, label


GPU_SHAPE = dict(hidden_size=256, head_dim=64, intermediate_size=512, vocab_size=512)  # head_dim: the kernels'


@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_the_same_function_on_the_gpu_backend(family, backend):
    """bf16 packed forward/backward with `backend` against the fp32 block-diagonal path (= eager per document),
    within the distance of that path's own bf16 run."""
    window = {"sliding_window": 48} if "sliding_window" in SPECS[family][1] else {}  # shorter than 2 documents
    config = family_config(family, **GPU_SHAPE, **window)
    name = _registered_or_skip(backend, AttentionFeatures.from_config(config.to_dict()))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=PACKED_SDPA).to(CUDA)
    for layer in model.model.layers:
        if hasattr(layer.self_attn, "sinks"):
            torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    docs = [torch.randint(0, 512, (n,)).tolist() for n in (150, 37, 90)]
    batch = {k: v.to(CUDA) if torch.is_tensor(v) else v
             for k, v in collate_packed([{"input_ids": d, "labels": d} for d in docs]).items()}
    truth = _loss_and_grads(model, batch, PACKED_SDPA, torch.float32)
    bf16_sdpa = _loss_and_grads(model, batch, PACKED_SDPA, torch.bfloat16)
    mine = _loss_and_grads(model, batch, name, torch.bfloat16)
    # bf16 rounds: the kernel may be off the fp32 truth by about what the block-diagonal path in bf16 is
    # (twice that, or 1e-3 of the loss / 2e-2 of a gradient); a dropped window or sink is far more.
    assert abs(mine[0] - truth[0]) <= max(2 * abs(bf16_sdpa[0] - truth[0]), 1e-3 * truth[0])
    for param, want in truth[1].items():
        bound = max(2 * _relative_error(bf16_sdpa[1][param], want), 2e-2)
        assert _relative_error(mine[1][param], want) <= bound, param


def _loss_and_grads(model, batch: dict, attn: str, dtype: torch.dtype) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad()
    model.set_attn_implementation(attn)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_every_family_under_context_parallelism_with_the_gpu_backend(backend):
    """Ulysses over 2 GPUs (NCCL, bf16) equals one rank, windows and gpt-oss's sinks sliced per rank's heads
    (tests/train/workers/exact_families_cp.py); a family the backend cannot compute is skipped there."""
    if (reason := PACKED_BACKENDS[backend][2](CUDA)) is not None:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(CP_WORKER), backend], cwd=REPO, env=launch_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" ok") + proc.stdout.count(" skip (") == 2 * len(FAMILIES)
    assert proc.stdout.count(" ok") >= 2 * 4  # the four without windows or sinks run on every backend
