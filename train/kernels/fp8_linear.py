"""Our own FP8 linear layer with tensorwise scaling (train.fp8_recipe = "tensorwise"), as opaque torch
ops around torch._scaled_mm: the input's cast, the forward, the backward.

The arithmetic is torchao's tensorwise recipe: one scale per tensor, max(dtype) / amax; inputs and
weights in e4m3, output gradients in e5m2; the forward GEMM accumulates in fp32 unless fast_accum,
the two backward GEMMs always do. What differs is how much memory traffic surrounds the GEMMs
(torchao's casts, compiled, took 4.6 of an 8B layer's 17.4 ms on an H200; bench/gpu_fp8_layer.py):
* each tensor's amax is one reduction and its cast one kernel that takes the scale from it
  (train/kernels/fp8_cast.py), writing the row-major copy, the transposed one or both at once;
* the forward keeps the input as the transposed float8 copy the weight-gradient GEMM reads (half the
  bytes of torchao's saved bf16 input, and no second amax or cast of it in the backward), and casts
  an input that several layers read (q, k, v; gate, up) once under compile;
* the backward casts the weight with the forward's amax, so it reads the weight once, not twice.
The GEMMs see the same float8 operands torchao's do; on CPU, where the cast is the torch reference
below, the output and both gradients equal torchao's Float8Linear's within one bf16 rounding
(tests/train/test_fp8_linear.py).

Only the amax and the cast are Triton kernels; their CPU path exists for those tests (FP8 training itself
is refused off the GPU, train/kernels/float8.py). As ops (like train/kernels/fa4.py) the compiled
decoder layer calls each as one node and never traces into the kernel launches.
"""

from __future__ import annotations

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ALIGNMENT = 16  # torch._scaled_mm needs both dimensions of each operand divisible by 16


def padded(tokens: int) -> int:
    """The token count rounded up to the FP8 GEMM's alignment (the weight gradient contracts over tokens)."""
    return (tokens + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| in fp32, one pass over x (on CUDA a Triton kernel: torch's reduction ran at half the memory
    bandwidth, 0.73 ms of an 8B layer on an H200). A torch reduction in the compiled graph, which inductor
    fuses into the kernel that writes x, saves that pass but was no faster (BENCHMARKS.md, eleventh session)."""
    if not x.is_cuda:
        return torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)
    from train.kernels import fp8_cast

    out = torch.zeros((), dtype=torch.float32, device=x.device)
    fp8_cast.amax_into(x.contiguous(), out)
    return out


def cast(x: torch.Tensor, x_amax: torch.Tensor, dtype: torch.dtype, rows: bool, cols: bool,
         ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """x [M, N] in `dtype` scaled by max(dtype) / amax: the row-major copy ([M, N]) and/or the transposed
    one ([N, M rounded up to ALIGNMENT], zero-padded), and the inverse scale torch._scaled_mm takes."""
    M, N = x.shape
    rows_out = torch.empty((M, N), dtype=dtype, device=x.device) if rows else None
    cols_out = None
    if cols:
        cols_out = torch.empty((N, padded(M)), dtype=dtype, device=x.device)
        cols_out[:, M:].zero_()  # the padding adds zero products to the weight gradient
    inverse = torch.empty((), dtype=torch.float32, device=x.device)
    if x.is_cuda:
        from train.kernels import fp8_cast

        fp8_cast.cast(x, x_amax, dtype, rows_out, cols_out, inverse)
        return rows_out, cols_out, inverse
    scale = torch.finfo(dtype).max / torch.clamp(x_amax.float(), min=1e-12)
    scaled = (x.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    if rows:
        rows_out.copy_(scaled)
    if cols:
        cols_out[:, :M].copy_(scaled.t())
    inverse.copy_(scale.reciprocal())
    return rows_out, cols_out, inverse


@torch.library.custom_op("sft::fp8_cast_input", mutates_args=())
def fp8_cast_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A linear layer's input x [T, K] in e4m3: the row-major copy the forward GEMM reads, the transposed
    one [K, T padded] the weight-gradient GEMM reads, and the inverse scale. Its own op so that the
    compiled graph computes it once for layers that share an input (q, k and v; gate and up):
    AOTAutograd's common-subexpression pass merges identical calls of a pure op."""
    x = x.contiguous()  # amax reads x as one block
    with torch.autocast(x.device.type, enabled=False):
        x8, x8t, x_inverse = cast(x, amax(x), E4M3, rows=True, cols=True)
    return x8, x8t, x_inverse


@fp8_cast_input.register_fake
def _cast_input_fake(x):
    x8t = x.new_empty((x.shape[1], padded(x.shape[0])), dtype=E4M3)
    return torch.empty_like(x, dtype=E4M3), x8t, x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("sft::fp8_linear_fwd", mutates_args=())
def fp8_linear_fwd(x: torch.Tensor, x8: torch.Tensor, x8t: torch.Tensor, x_inverse: torch.Tensor,
                   weight: torch.Tensor, fast_accum: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] @ weight [N, K]^T in float8 from x's casts (fp8_cast_input) → (y [T, N] in x's dtype, the
    weight's amax for the backward). x itself is only where the input gradient goes."""
    with torch.autocast(x.device.type, enabled=False):
        w_amax = amax(weight)
        w8, _, w_inverse = cast(weight, w_amax, E4M3, rows=True, cols=False)
        y = torch._scaled_mm(x8, w8.t(), x_inverse, w_inverse, out_dtype=x.dtype, use_fast_accum=fast_accum)
    return y, w_amax


@fp8_linear_fwd.register_fake
def _fwd_fake(x, x8, x8t, x_inverse, weight, fast_accum):
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("sft::fp8_linear_bwd", mutates_args=())
def fp8_linear_bwd(dy: torch.Tensor, x8t: torch.Tensor, x_inverse: torch.Tensor, weight: torch.Tensor,
                   w_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and weight gradients: dy [T, N] e5m2 @ weight (e4m3, cast with the forward's amax),
    and dy^T @ x from the saved transposed copy; both GEMMs accumulate in fp32."""
    with torch.autocast(dy.device.type, enabled=False):
        dy = dy.contiguous()
        dy8, dy8t, dy_inverse = cast(dy, amax(dy), E5M2, rows=True, cols=True)
        _, w8t, w_inverse = cast(weight, w_amax, E4M3, rows=False, cols=True)
        dx = torch._scaled_mm(dy8, w8t.t(), dy_inverse, w_inverse, out_dtype=dy.dtype)
        dw = torch._scaled_mm(dy8t, x8t.t(), dy_inverse, x_inverse, out_dtype=weight.dtype)
    return dx, dw


@fp8_linear_bwd.register_fake
def _bwd_fake(dy, x8t, x_inverse, weight, w_amax):
    return dy.new_empty((dy.shape[0], weight.shape[1])), torch.empty_like(weight)


def _setup_context(ctx, inputs, output) -> None:
    _, _, x8t, x_inverse, weight, _ = inputs
    ctx.save_for_backward(x8t, x_inverse, weight, output[1])


def _backward(ctx, dy, _):
    x8t, x_inverse, weight, w_amax = ctx.saved_tensors
    dx, dw = fp8_linear_bwd(dy, x8t, x_inverse, weight, w_amax)
    return dx, None, None, None, dw, None


fp8_linear_fwd.register_autograd(_backward, setup_context=_setup_context)


class Float8TrainingLinear(torch.nn.Linear):
    """A torch.nn.Linear whose matmuls run in float8 (the class of a converted layer: same parameters,
    names and state dict, so checkpoints and the export see the stock model)."""

    fast_accum: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        x2d = x.to(dtype).reshape(-1, self.in_features)
        y, _ = fp8_linear_fwd(x2d, *fp8_cast_input(x2d.detach()), self.weight.to(dtype), self.fast_accum)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(dtype)


def convert(module: torch.nn.Linear, fast_accum: bool) -> None:
    """Make `module` a Float8TrainingLinear in place."""
    module.__class__ = Float8TrainingLinear
    module.fast_accum = fast_accum
