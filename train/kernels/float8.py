"""FP8 training (train.precision = "fp8"): the decoder's linear layers become float8 linears, our own
(train/kernels/fp8_linear.py) for "tensorwise" or torchao's `Float8Linear` (contract.config.fp8_linears).

Each converted layer casts its input, weight and output gradient to float8 (e4m3 forward, e5m2 for
gradients) with dynamic scales and runs its three matmuls on the FP8 tensor cores
(`torch._scaled_mm`); the fp32 master weights, the optimizer, attention, norms, the embedding and
lm_head (with the fused loss) stay as they are, so checkpoints, the export and parameter names are
the stock model's. Recipes (`train.fp8_recipe`): "tensorwise", one scale per tensor (fastest), in our
linears; "torchao-tensorwise", the same in torchao's; or "rowwise" (torchao's), a scale per row, finer in
principle; on H100s it was slower than bf16 at 1B and learned no closer to bf16 in the parity benchmark
(BENCHMARKS.md, 2026-11-27). The forward GEMM accumulates in
fp32 like the two backward ones (`train.fp8_fast_accum` = false, the default). torchao's recipes
accumulate it in the tensor cores' reduced precision, whose error grows with the inner dimension
(DeepSeek-V3's report, section 3.3): in the parity benchmark that learned 1.4% worse than bf16, fp32
accumulation within 1%, for 0.7% of FP8's speed at 8B (BENCHMARKS.md, 2 x H200).

Where FP8's time goes, in one 8B decoder layer on an H100 (bench/gpu_fp8_layer.py, BENCHMARKS.md):
its GEMMs are 1.8x faster than bf16's, but torchao's amax reductions and casts, compiled, take about
5 of the layer's 18 ms, so the layer gains 1.15-1.22x and a whole step less (1.13x at 8B on 4 H100s).
No inductor setting, recipe or subset of the linears tried there gained more than 1.22x; our linears,
whose casts and amaxes take under 2 ms of the layer, gave 1.24x there and 1.243-1.290x a step at 8B on
2 H200s, 1.267x over six calls.

Applied by train/engine/model.py before FSDP2 wraps the model (Accelerate's prepare), as torchtitan
does; layers whose dimensions are not multiples of 16 (the FP8 GEMMs' alignment) stay bf16, and the
token dimension of a packed micro-batch (any length) is padded inside the GEMMs (`pad_inner_dim`).

FSDP2 all-gathers the weights in bf16 and each layer casts them, unless `train.fp8_all_gather`
(tensorwise only): then torchao's float8 all-gather (`enable_fsdp_float8_all_gather`) casts each
rank's shard and all-gathers float8 (half the bytes), with the scales of all weights computed in
one all-reduce at each step boundary (`precompute_scales`, as torchtitan). Off by default: not yet
measured on a GPU. It needs two repairs under Accelerate's FSDP2, found in a 2-rank gloo check:
* Accelerate's rank-0 loading (cpu_ram_efficient_loading) assigns the ranks > 0 parameters built
  from plain tensors (rank 0 keeps torchao's weight wrapper): the ranks' all-gathers disagree and
  the job hangs or aborts. `keep_weight_wrapper`, a load-state-dict pre-hook, wraps them again.
* Accelerate maps the optimizer's parameters to the sharded ones by data pointer, which torchao's
  wrapper reports as 0: every float8 weight mapped to the last one. The tiny model's 13 other float8
  weights were never updated nor their gradients zeroed (they summed over the steps), the last one
  was updated 14 times a step; a resumed process starts without those stale gradients, so its first
  step differed (the earlier "grad norm 2.31 vs 2.08"; here 2.32 vs 2.26). The optimizer's groups
  are rebuilt from the prepared model (train/engine/optim.py).
With both, on CPU (fp32) the losses and weights equal those of the bf16 all-gather bit for bit,
and a resumed run equals an uninterrupted one (tests/train/test_float8_all_gather.py).
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import torch

from contract.config import fp8_linears
from contract.gpus import fp8_blocker
from train.kernels import fp8_linear

logger = logging.getLogger(__name__)

TORCHAO_RECIPES = {"torchao-tensorwise": "tensorwise"}  # train.fp8_recipe -> torchao's name, where they differ


def unavailable(device: torch.device) -> str | None:
    """Why FP8 cannot run on this device (one line), None when it can."""
    on_gpu = device.type == "cuda"
    return fp8_blocker(on_gpu, torch.cuda.get_device_capability(device) if on_gpu else None)


def convertible(module: torch.nn.Module, fqn: str) -> bool:
    """A decoder linear layer FP8 can run: not lm_head, both dimensions multiples of fp8_linear.ALIGNMENT."""
    if not isinstance(module, torch.nn.Linear):
        return True  # torchao asks for every module on the way down; only linears are swapped
    aligned = module.in_features % fp8_linear.ALIGNMENT == 0 and module.out_features % fp8_linear.ALIGNMENT == 0
    return aligned and fqn.split(".")[-1] != "lm_head"


def float8_config(recipe: str, fast_accum: bool, all_gather: bool = False):
    """torchao's Float8LinearConfig for `recipe` as training runs it."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.config import Float8GemmConfig

    # Packed micro-batches hold any number of tokens; the weight gradient's FP8 GEMM contracts over them
    # and needs a multiple of 16 (measured: 2,430 tokens failed): torchao pads that inner dimension.
    # torchao's recipes accumulate the forward GEMM in the tensor cores' reduced precision ("fast
    # accumulation"), the two backward GEMMs in fp32; fast_accum=False makes the forward exact as well.
    return dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), pad_inner_dim=True,
                               gemm_config_output=Float8GemmConfig(use_fast_accum=fast_accum),
                               enable_fsdp_float8_all_gather=all_gather)


def convert_decoder_linears(layers: list[torch.nn.Module], recipe: str, fast_accum: bool,
                            all_gather: bool = False) -> int:
    """Make the linear layers of each decoder layer float8 linears in place; returns how many: "tensorwise"
    our own (train/kernels/fp8_linear.py), unless `all_gather` (FSDP2 all-gathers the weights in float8,
    which needs torchao's weight wrapper); "torchao-tensorwise" and "rowwise" torchao's Float8Linear."""
    if fp8_linears(recipe, all_gather) == "ours":
        return _convert_to_own(layers, fast_accum)
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = float8_config(TORCHAO_RECIPES.get(recipe, recipe), fast_accum, all_gather)
    for layer in layers:
        convert_to_float8_training(layer, module_filter_fn=convertible, config=config)
    converted = [m for layer in layers for m in layer.modules() if isinstance(m, Float8Linear)]
    if all_gather:
        for module in converted:
            module.register_load_state_dict_pre_hook(keep_weight_wrapper)
    return len(converted)


def _convert_to_own(layers: list[torch.nn.Module], fast_accum: bool) -> int:
    converted = [module for layer in layers for fqn, module in layer.named_modules()
                 if isinstance(module, torch.nn.Linear) and convertible(module, fqn)]
    for module in converted:
        fp8_linear.convert(module, fast_accum)
    return len(converted)


def all_gathers_in_float8(model: torch.nn.Module) -> bool:
    """Whether FSDP2 all-gathers some of the model's weights in float8 (`train.fp8_all_gather`). False
    without importing torchao where nothing was converted (a run not in FP8 never loaded it)."""
    float8_linear = sys.modules.get("torchao.float8.float8_linear")
    if float8_linear is None:
        return False
    Float8Linear = float8_linear.Float8Linear
    return any(isinstance(m, Float8Linear) and m.config.enable_fsdp_float8_all_gather for m in model.modules())


def precompute_scales(model: torch.nn.Module) -> None:
    """The float8 all-gather's weight scales, all in one all-reduce (a no-op without it): after each
    optimizer step, and once before the first step, so every step of a run, resumed or not, casts
    with a precomputed scale."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def keep_weight_wrapper(module: torch.nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """Load-state-dict pre-hook of a Float8Linear with float8 all-gather: a sharded weight loaded as a
    plain DTensor gets torchao's wrapper around its shard, so every rank all-gathers it in float8."""
    from torch.distributed.tensor import DTensor
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    value = state_dict.get(prefix + "weight")
    if not isinstance(value, DTensor) or isinstance(value._local_tensor, WeightWithDynamicFloat8CastTensor):
        return
    shard = WeightWithDynamicFloat8CastTensor(value._local_tensor, module.linear_mm_config,
                                              module.config.cast_config_weight.target_dtype)
    state_dict[prefix + "weight"] = DTensor.from_local(shard, value.device_mesh, value.placements, run_check=False,
                                                       shape=value.shape, stride=value.stride())
