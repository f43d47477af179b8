"""GPU facts shared by the launcher (validation, planner) and train (MFU): peak dense bf16 FLOP/s
(and float8's, printed beside it: MFU stays against the bf16 peak, FP8 runs included), memory and
compute capability, keyed by a short type name. Pure Python (no torch).

Peak numbers are the datasheets' *dense* (no sparsity) 16-bit tensor-core rates. An unknown GPU
has no entry: callers then report no MFU and warn once, never guess.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str  # short type name used in cluster profiles (gpu_type)
    peak_tflops_bf16: float  # dense; for GPUs without bf16 (V100) the fp16 rate
    memory_gib: float  # nominal (A100 80GB: 81920 MiB = 80 GiB; CUDA reports ~79.2 after the driver's reserve)
    compute_capability: tuple[int, int]
    has_bf16: bool = True
    peak_tflops_fp8: float | None = None  # dense float8 tensor-core rate (compute capability >= 8.9); None = no FP8


# GPU-only attention backends (train/kernels/attention.py): the lowest compute capability their kernels are
# built for. The launcher checks the profile's GPU against it, training the device it runs on.
# (torch's own varlen kernel is FlashAttention-2 too: same floor as flash_attn.)
ATTENTION_MIN_CAPABILITY: dict[str, tuple[int, int]] = {"flash_attn": (8, 0), "fa4": (9, 0)}

# quack's CuTe DSL kernels (the fused SwiGLU MLP's GEMMs in train/kernels/swiglu.py, the fused loss's
# cross-entropy pass in train/kernels/loss.py): Hopper and Blackwell.
QUACK_CAPABILITY: tuple[tuple[int, int], tuple[int, int]] = ((9, 0), (10, 3))


def quack_runs_on(capability: tuple[int, int]) -> bool:
    low, high = QUACK_CAPABILITY
    return low <= capability <= high


# float8 tensor cores (torch._scaled_mm, torchao's float8 linears): Ada, Hopper, Blackwell.
FP8_MIN_CAPABILITY = (8, 9)


def fp8_blocker(on_gpu: bool, capability: tuple[int, int] | None) -> str | None:
    """Why this device cannot train with train.precision = "fp8", None when nothing here forbids it.
    `capability` None: a GPU this table does not know (the compute node checks the real device)."""
    if not on_gpu:
        return "float8 matmuls need a CUDA GPU with FP8 tensor cores (this is a CPU run)"
    low = FP8_MIN_CAPABILITY
    if capability is not None and capability < low:
        return (f"it needs FP8 tensor cores (compute capability >= {low[0]}.{low[1]}: Ada, Hopper, Blackwell; "
                f"this GPU has {capability[0]}.{capability[1]})")
    return None


def fused_mlp_blocker(on_gpu: bool, capability: tuple[int, int] | None, lora: bool, zero_stage: int | None) -> str | None:
    """Why a job cannot use the fused SwiGLU MLP (train.fused_mlp), None when nothing here forbids it.
    `capability` None: a GPU this table does not know (the compute node checks the real device)."""
    if lora:  # adapters on the MLP would be skipped; a frozen MLP needs no weight gradients
        return "LoRA is on (the fused backward computes the weight gradients a frozen base does not need)"
    if zero_stage == 3:
        return "DeepSpeed ZeRO-3 gathers a linear layer's weight only in that layer's own forward"
    if not on_gpu:
        return "it runs only on CUDA GPUs"
    if capability is not None and not quack_runs_on(capability):
        low, high = QUACK_CAPABILITY
        return (f"it needs Hopper or Blackwell (compute capability {low[0]}.{low[1]}-{high[0]}.{high[1]}; "
                f"this GPU has {capability[0]}.{capability[1]})")
    return None


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in [
        GpuSpec("v100", 125.0, 32.0, (7, 0), has_bf16=False),
        GpuSpec("t4", 65.0, 16.0, (7, 5), has_bf16=False),
        GpuSpec("a10", 125.0, 24.0, (8, 6)),
        GpuSpec("a10g", 70.0, 24.0, (8, 6)),
        GpuSpec("a100-40gb", 312.0, 40.0, (8, 0)),
        GpuSpec("a100", 312.0, 80.0, (8, 0)),
        GpuSpec("l4", 121.0, 24.0, (8, 9), peak_tflops_fp8=242.0),
        GpuSpec("l40s", 362.0, 48.0, (8, 9), peak_tflops_fp8=733.0),
        GpuSpec("h100-pcie", 756.0, 80.0, (9, 0), peak_tflops_fp8=1513.0),
        GpuSpec("h100", 989.0, 80.0, (9, 0), peak_tflops_fp8=1979.0),  # SXM
        GpuSpec("h100-nvl", 835.0, 94.0, (9, 0), peak_tflops_fp8=1671.0),
        GpuSpec("gh200", 989.0, 96.0, (9, 0), peak_tflops_fp8=1979.0),
        GpuSpec("h200", 989.0, 141.0, (9, 0), peak_tflops_fp8=1979.0),
        GpuSpec("b200", 2250.0, 180.0, (10, 0), peak_tflops_fp8=4500.0),
    ]
}

# torch.cuda.get_device_name() substrings -> type name; most specific first.
_DEVICE_NAME_PATTERNS: list[tuple[str, str]] = [
    ("gh200", "gh200"),
    ("h200", "h200"),
    ("h100 nvl", "h100-nvl"),
    ("h100 pcie", "h100-pcie"),
    ("h100", "h100"),
    ("b200", "b200"),
    ("a100-sxm4-40gb", "a100-40gb"),
    ("a100-pcie-40gb", "a100-40gb"),
    ("a100", "a100"),
    ("l40s", "l40s"),
    ("a10g", "a10g"),
    ("a10", "a10"),
    ("l4", "l4"),
    ("v100", "v100"),
    ("tesla t4", "t4"),
]


def gpu_type_from_device_name(device_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; None when unknown."""
    lowered = device_name.lower()
    for pattern, type_name in _DEVICE_NAME_PATTERNS:
        if pattern in lowered:
            return type_name
    return None


def lookup(gpu_type: str) -> GpuSpec | None:
    return GPUS.get(gpu_type.lower()) if gpu_type else None


def mixed_precision(precision: str, on_gpu: bool, has_bf16: bool | None) -> str:
    """Accelerate's / DeepSpeed's mixed_precision ('bf16', 'fp16', 'no') for model.precision.

    'auto' = bf16 on GPUs that have it (`has_bf16` None: unknown GPU, assumed to), fp16 on older
    GPUs, fp32 ('no') on CPU. The launcher renders it from the profile's GPU; training asks torch.
    """
    if not on_gpu or precision == "fp32":
        return "no"
    if precision == "fp16" or (precision == "auto" and has_bf16 is False):
        return "fp16"
    return "bf16"
