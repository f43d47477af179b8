"""The float8 cast of train/kernels/fp8_linear.py as one Triton kernel (CUDA only; the CPU path is
that module's torch reference).

Why a kernel of our own: torchao's casts, compiled by inductor, took 4.6 of an 8B decoder layer's
17.4 ms on an H200 (bench/gpu_fp8_layer.py --top 40), while its FP8 GEMMs took 7.7: the transposed
float8 copies the weight-gradient GEMMs read ran as pointwise kernels with strided stores, and every
tensor's scale was a chain of tiny kernels. Here one launch reads a bf16 [M, N] tile by tile, takes
its scale from the amax already computed (so a cast never re-reads its input for the scale), and
writes the row-major float8 copy, the transposed one (zero-padded to a multiple of 16 rows-of-tokens,
as the FP8 GEMM's inner dimension needs), or both; its first program writes the inverse scale
torch._scaled_mm takes. The amax is a Triton kernel too (torch's reduction ran at half the memory
bandwidth). Triton's float8 conversion rounds a few values just below the midpoint of two float8
subnormals up where torch rounds them down (7 of 14,336,000 in tests/train/test_fp8_linear.py on an
H200), so the GPU cast equals the CPU reference but for those.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 64  # square tiles: the transposed store goes through shared memory either way


@triton.jit
def _cast_kernel(x_ptr, amax_ptr, rows_ptr, cols_ptr, inverse_ptr, M, N, stride_x, stride_rows, stride_cols,
                 FP8_MAX: tl.constexpr, WRITE_ROWS: tl.constexpr, WRITE_COLS: tl.constexpr, BLOCK: tl.constexpr):
    amax = tl.load(amax_ptr).to(tl.float32)
    scale = tl.math.div_rn(FP8_MAX, tl.maximum(amax, 1e-12))  # rounded as torch divides, not approximated
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(inverse_ptr, tl.math.div_rn(1.0, scale))
    rm = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_x + rn[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.clamp(x * scale, -FP8_MAX, FP8_MAX).to(cols_ptr.dtype.element_ty)
    if WRITE_ROWS:
        tl.store(rows_ptr + rm[:, None].to(tl.int64) * stride_rows + rn[None, :], y, mask=mask)
    if WRITE_COLS:
        # the tile transposed: columns of x become rows of the copy; padded columns stay as allocated (zero)
        tl.store(cols_ptr + rn[:, None].to(tl.int64) * stride_cols + rm[None, :], tl.trans(y), mask=tl.trans(mask))


@triton.jit
def _amax_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    running = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ITERS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        running = tl.maximum(running, tl.abs(tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)))
    tl.atomic_max(out_ptr, tl.max(running, 0))


def amax_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """out = max(out, max |x|) for a contiguous x; `out` a 0-d fp32 tensor (zero to start from)."""
    assert x.is_contiguous(), "the amax reads x as one block of memory"
    block, iters = 2048, 8
    _amax_kernel[(triton.cdiv(x.numel(), block * iters),)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=8)


def cast(x: torch.Tensor, amax: torch.Tensor, dtype: torch.dtype, rows: torch.Tensor | None,
         cols: torch.Tensor | None, inverse: torch.Tensor) -> None:
    """Write x [M, N] cast to `dtype` with scale max(dtype) / amax into `rows` ([M, N]) and/or `cols`
    ([N, >= M], x transposed), and the inverse scale into `inverse` (a 0-d fp32 tensor)."""
    M, N = x.shape
    assert x.stride(1) == 1, "the cast reads rows of x"
    target = cols if cols is not None else rows
    grid = (triton.cdiv(M, BLOCK), triton.cdiv(N, BLOCK))
    _cast_kernel[grid](x, amax, rows if rows is not None else target, target, inverse, M, N, x.stride(0),
                       rows.stride(0) if rows is not None else 0, cols.stride(0) if cols is not None else 0,
                       FP8_MAX=torch.finfo(dtype).max, WRITE_ROWS=rows is not None, WRITE_COLS=cols is not None,
                       BLOCK=BLOCK, num_warps=4)
