"""Is the packed-attention backward bitwise repeatable under `train.deterministic`?

A resumed run can only equal an uninterrupted one bit for bit when every kernel of the step is
deterministic. torch's FlashAttention varlen backward reads the global determinism setting; this
probe runs the same forward+backward twice under each setting and says whether dq/dk/dv repeat.

    python3 bench/kernels/gpu_determinism.py          # GPU only; prints one table
"""

from __future__ import annotations

import sys

import torch


def packed_inputs(docs: list[int], heads: int = 16, kv_heads: int = 4, dim: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = sum(docs)
    q = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    k = torch.randn(total, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    v = torch.randn(total, kv_heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    return q, k, v, cu, max(docs)


def grads_once(docs: list[int]) -> list[torch.Tensor]:
    from train.kernels.attention import torch_varlen_kernel

    q, k, v, cu, longest = packed_inputs(docs)
    out = torch_varlen_kernel(q, k, v, cu, cu, longest, longest, None, 0.0)
    out.float().pow(2).sum().backward()
    return [t.grad.clone() for t in (q, k, v)]


def repeats(mode: str, docs: list[int], tries: int = 5) -> bool:
    torch.use_deterministic_algorithms(mode != "off", warn_only=mode == "warn_only")
    first = grads_once(docs)
    return all(all(torch.equal(a, b) for a, b in zip(first, grads_once(docs))) for _ in range(tries))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_determinism: needs a CUDA GPU", file=sys.stderr)
        return 2
    docs = [4096, 1800, 700, 1500, 200, 3000, 5000, 380]  # long documents: many key blocks per query block
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, docs {docs}")
    print(f"{'use_deterministic_algorithms':<32}{'dq/dk/dv repeat bitwise':>24}")
    for mode in ("off", "warn_only", "strict"):
        try:
            verdict = "yes" if repeats(mode, docs) else "NO"
        except RuntimeError as err:
            verdict = f"error: {str(err).splitlines()[0][:80]}"
        print(f"{mode:<32}{verdict:>24}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
