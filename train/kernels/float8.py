"""FP8 training (train.precision = "fp8"): the decoder's linear layers become torchao's `Float8Linear`.

Each converted layer casts its input, weight and output gradient to float8 (e4m3 forward, e5m2 for
gradients) with dynamic scales and runs its three matmuls on the FP8 tensor cores
(`torch._scaled_mm`); the fp32 master weights, the optimizer, attention, norms, the embedding and
lm_head (with the fused loss) stay as they are, so checkpoints, the export and parameter names are
the stock model's. Recipes (`train.fp8_recipe`): "tensorwise", one scale per tensor (fastest), or
"rowwise", a scale per row, finer in principle; on H100s it was slower than bf16 at 1B and learned no
closer to bf16 in the parity benchmark (BENCHMARKS.md, 2026-11-27). The forward GEMM accumulates in
fp32 like the two backward ones (`train.fp8_fast_accum` = false, the default). torchao's recipes
accumulate it in the tensor cores' reduced precision, whose error grows with the inner dimension
(DeepSeek-V3's report, section 3.3): in the parity benchmark that learned 1.4% worse than bf16, fp32
accumulation within 1%, for 0.7% of FP8's speed at 8B (BENCHMARKS.md, 2 x H200).

Applied by train/engine/model.py before FSDP2 wraps the model (Accelerate's prepare), as torchtitan
does; layers whose dimensions are not multiples of 16 (the FP8 GEMMs' alignment) stay bf16, and the
token dimension of a packed micro-batch (any length) is padded inside the GEMMs (`pad_inner_dim`).

FSDP2 all-gathers the weights in bf16 and each layer casts them: torchao's float8 all-gather
(`enable_fsdp_float8_all_gather`) is not used. Under Accelerate's FSDP2 it broke two things in our
2-rank check (gloo): Accelerate's rank-0 loading rebuilds the other ranks' parameters from plain
tensors, dropping torchao's weight wrapper (the ranks' all-gathers then disagree and the job aborts),
and, with the weights broadcast beforehand instead, a resumed run's first step computed other weight
gradients than the uninterrupted run's (grad norm 2.31 vs 2.08): no bitwise resume. Without it
(and with "rowwise", which never all-gathers in float8) the resume is bitwise.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from contract.gpus import fp8_blocker

logger = logging.getLogger(__name__)

ALIGNMENT = 16  # torch._scaled_mm needs both dimensions of each operand divisible by 16


def unavailable(device: torch.device) -> str | None:
    """Why FP8 cannot run on this device (one line), None when it can."""
    on_gpu = device.type == "cuda"
    return fp8_blocker(on_gpu, torch.cuda.get_device_capability(device) if on_gpu else None)


def convertible(module: torch.nn.Module, fqn: str) -> bool:
    """A decoder linear layer FP8 can run: not lm_head, both dimensions multiples of ALIGNMENT."""
    if not isinstance(module, torch.nn.Linear):
        return True  # torchao asks for every module on the way down; only linears are swapped
    aligned = module.in_features % ALIGNMENT == 0 and module.out_features % ALIGNMENT == 0
    return aligned and fqn.split(".")[-1] != "lm_head"


def convert_decoder_linears(layers: list[torch.nn.Module], recipe: str, fast_accum: bool) -> int:
    """Swap the linear layers of each decoder layer for Float8Linear in place; returns how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.config import Float8GemmConfig
    from torchao.float8.float8_linear import Float8Linear

    # Packed micro-batches hold any number of tokens; the weight gradient's FP8 GEMM contracts over them
    # and needs a multiple of 16 (measured: 2,430 tokens failed): torchao pads that inner dimension.
    # torchao's recipes accumulate the forward GEMM in the tensor cores' reduced precision ("fast
    # accumulation"), the two backward GEMMs in fp32; fast_accum=False makes the forward exact as well.
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True,
                                 gemm_config_output=Float8GemmConfig(use_fast_accum=fast_accum))
    for layer in layers:
        convert_to_float8_training(layer, module_filter_fn=convertible, config=config)
    return sum(isinstance(m, Float8Linear) for layer in layers for m in layer.modules())
