"""Our FP8 linear (train/kernels/fp8_linear.py) computes torchao's tensorwise recipe: on CPU (the torch
reference cast) its output and gradients equal torchao's Float8Linear's within one bf16 rounding (the
float8 operands are the same; CPU _scaled_mm adds in another order for another layout); compiled
with dynamic shapes it gives what it gives eagerly. On an FP8 GPU the Triton cast writes what the torch
reference writes, but for a few subnormals (skipped without one)."""

from __future__ import annotations

import copy

import pytest
import torch

from train.kernels import fp8_linear

IN, OUT = 64, 96


def _pair(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(tokens)
    return (torch.randn(tokens, IN, generator=g).to(torch.bfloat16),
            torch.randn(tokens, OUT, generator=g).to(torch.bfloat16))


def _grads(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(dy)
    weight = module.weight if hasattr(module, "weight") else module[0].weight
    grads = y.detach(), x.grad, weight.grad.clone()
    weight.grad = None
    return grads


@pytest.fixture
def linears() -> tuple[torch.nn.Module, torch.nn.Module]:
    from torchao.float8 import convert_to_float8_training

    from train.kernels.float8 import float8_config

    torch.manual_seed(0)
    base = torch.nn.Linear(IN, OUT, bias=False).to(torch.bfloat16)
    ours = copy.deepcopy(base)
    fp8_linear.convert(ours, fast_accum=False)
    theirs = torch.nn.Sequential(copy.deepcopy(base))
    convert_to_float8_training(theirs, config=float8_config("tensorwise", fast_accum=False))
    return ours, theirs


@pytest.mark.parametrize("tokens", [37, 64])  # 37: the weight gradient's inner dimension is padded
def test_equals_torchao_tensorwise_on_cpu(linears, tokens):
    ours, theirs = linears
    x, dy = _pair(tokens)
    y, dx, dw = _grads(ours, x, dy)
    y_ref, dx_ref, dw_ref = _grads(theirs, x, dy)
    assert type(theirs[0]).__name__ == "Float8Linear"
    for got, want in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)):
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)
    assert list(ours.state_dict()) == ["weight"]  # checkpoints and the export see a plain linear


def test_compiled_with_dynamic_shapes_equals_eager(linears):
    ours, _ = linears
    torch._dynamo.reset()
    compiled = torch.compile(ours, dynamic=True)
    for tokens in (37, 50):
        x, dy = _pair(tokens)
        for got, want in zip(_grads(compiled, x, dy), _grads(ours, x, dy)):
            assert torch.equal(got, want)


def test_autocast_runs_the_matmuls_from_bf16():
    torch.manual_seed(0)
    linear = torch.nn.Linear(IN, OUT, bias=True)  # fp32 parameters, as without FSDP2's param dtype
    fp8_linear.convert(linear, fast_accum=False)
    x, _ = _pair(16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x.float())
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert linear.weight.grad.dtype == torch.float32 and linear.bias.grad is not None


def _subnormal_rounding_only(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """got equals want except for values below the smallest normal float8 number, one float8 step apart: Triton's
    conversion rounds some values just below the midpoint of two subnormals up (on an H200, 7 of 14,336,000:
    x·scale 0.00683594 to 0.0078125 where torch gives 0.00585938)."""
    got, want = got.float(), want.float()
    differ = got != want
    tiny = torch.finfo(dtype).smallest_normal
    assert (want[differ].abs() < tiny).all() and ((got - want)[differ].abs() <= tiny * torch.finfo(dtype).eps).all(), (
        f"{int(differ.sum())} of {differ.numel()} differ, e.g. got {got[differ][:4].tolist()}, "
        f"want {want[differ][:4].tolist()}")
    assert differ.sum() <= differ.numel() * 1e-5


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a GPU with FP8 tensor cores (compute capability >= 8.9)")
@pytest.mark.parametrize("shape", [(37, 64), (4096, 1024), (1000, 14336)])
@pytest.mark.parametrize("dtype", [fp8_linear.E4M3, fp8_linear.E5M2])
def test_triton_cast_writes_the_reference(shape, dtype):
    x = torch.randn(shape, device="cuda").to(torch.bfloat16) * 3
    x_amax = fp8_linear.amax(x)
    rows, cols, inverse = fp8_linear.cast(x, x_amax, dtype, rows=True, cols=True)
    rows_ref, cols_ref, inverse_ref = fp8_linear.cast(x.cpu(), x_amax.cpu(), dtype, rows=True, cols=True)
    _subnormal_rounding_only(rows.cpu(), rows_ref, dtype)
    _subnormal_rounding_only(cols.cpu(), cols_ref, dtype)
    torch.testing.assert_close(inverse.cpu(), inverse_ref, rtol=1e-6, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="needs a GPU with FP8 tensor cores (compute capability >= 8.9)")
def test_equals_torchao_tensorwise_on_gpu(linears):
    ours, theirs = (module.cuda() for module in linears)
    x, dy = (t.cuda() for t in _pair(300))
    for got, want in zip(_grads(ours, x, dy), _grads(theirs, x, dy)):
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-5)


def test_compiled_layers_sharing_an_input_cast_it_once(monkeypatch):
    """q, k and v read one input: under compile its float8 copies are made once (AOTAutograd merges the
    identical fp8_cast_input calls), so a step casts 2 weights and 2 output gradients per layer, and 1 input."""
    casts = []
    reference_cast = fp8_linear.cast
    monkeypatch.setattr(fp8_linear, "cast", lambda x, *args, **kw: casts.append(x.shape) or reference_cast(x, *args, **kw))

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(IN, OUT, bias=False), torch.nn.Linear(IN, IN, bias=False)
            for linear in (self.a, self.b):
                fp8_linear.convert(linear, fast_accum=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x).sum() + self.b(x).sum()

    torch._dynamo.reset()
    compiled = torch.compile(Shared().to(torch.bfloat16), dynamic=True)
    x, _ = _pair(48)
    compiled(x * 1).backward()
    casts.clear()
    compiled(x * 1).backward()
    assert sorted(casts).count(torch.Size([48, IN])) == 1 + 1  # the input once, b's output gradient once
    assert len(casts) == 1 + 2 * 2 + 2  # the input; each weight forward and backward; each output gradient
