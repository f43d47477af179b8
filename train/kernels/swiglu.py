"""The Llama MLP, down(silu(gate(x)) * up(x)), with SwiGLU computed inside the GEMMs (quack's CuTe
DSL kernels, Hopper and Blackwell; `quack-kernels` comes with flash-attn-4).

Why: on the 1B shape the SwiGLU product and its gradient are separate elementwise passes over
[tokens, ffn] tensors, about a tenth of a step at the memory-bandwidth roof (issue #13; its files
were removed in #33, no provenance).
Here the forward's gate/up GEMM writes the pre-activation and the product in its epilogue, and the
backward's first GEMM (dout @ W_down) applies the SwiGLU gradient and recomputes the product in
its epilogue, so no elementwise kernel runs and the product is not kept for the backward.

Only those two GEMMs are quack's; the other three (down projection, its weight gradient, and the
gate/up input and weight gradients) are plain matmuls and run on cuBLAS, which is faster than
quack's plain GEMM at its default configs. The two epilogue GEMMs run with configs pinned per GPU
and shape (train/assets/gemm_configs.json, measured by `python -m bench.gpu_gemm_tune --write`): quack's
autotuner would pick the same ones but keys on the exact token count, and packed rows change it
nearly every step (minutes of tuning each time). Shapes not in the file use quack's defaults.

quack's gated epilogue reads gate and up as interleaved columns (gate_0, up_0, gate_1, ...), so the
gate and up weights are stacked row-interleaved per call (one small copy per layer, fused with the
autocast cast) and their gradient is split the same way; the parameters stay separate, so
checkpoints, sharding and export see the stock model.

Like train/kernels/fa4.py, forward and backward are `torch.library.custom_op`s with fake implementations:
the compiled decoder layer keeps each as one call and never traces into quack's Python launchers.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import types

import torch

from contract.config import SHIPPED_ASSETS
from contract.gpus import fused_mlp_blocker

logger = logging.getLogger(__name__)

GEMM_CONFIGS = SHIPPED_ASSETS / "gemm_configs.json"


@functools.cache
def _gemm():
    return importlib.import_module("quack.gemm_interface")


def import_problem() -> str | None:
    """None when quack-kernels imports with the GEMMs used here, else why not (one line). Where the
    fused MLP may run at all (GPU generation, LoRA, ZeRO-3) is contract.gpus.fused_mlp_blocker."""
    try:
        gemm = _gemm()
    except ImportError as error:
        return f"quack-kernels is not installed or does not import ({error}; it comes with 'sft-launch[flash4]')"
    for name in ("gemm_gated", "gemm_dgated"):
        if not hasattr(gemm, name):
            return f"this quack-kernels version has no quack.gemm_interface.{name}"
    return None


def unavailable(device: torch.device, lora: bool = False, zero_stage: int | None = None) -> str | None:
    """None when the fused SwiGLU MLP can run on `device` in this job, else why not (one line)."""
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    capability = torch.cuda.get_device_capability(device) if on_gpu else None
    return fused_mlp_blocker(on_gpu, capability, lora, zero_stage) or import_problem()


def config_key(capability: tuple[int, int], gemm: str, n: int, k: int) -> str:
    """How gemm_configs.json names one GEMM: 'sm90 gated n=16384 k=2048' (N, K of the GEMM itself)."""
    return f"sm{capability[0]}{capability[1]} {gemm} n={n} k={k}"


@functools.cache
def _pinned_fields() -> dict[str, dict]:
    return {key: entry["config"] for key, entry in json.loads(GEMM_CONFIGS.read_text())["configs"].items()}


@functools.cache
def pinned_config(capability: tuple[int, int], gemm: str, n: int, k: int):
    """quack's GemmConfig measured best for this GEMM on this GPU, or None (quack's default config)."""
    fields = _pinned_fields().get(config_key(capability, gemm, n, k))
    if fields is None:
        return None
    try:
        return importlib.import_module("quack.gemm_config").GemmConfig(**fields)
    except TypeError as error:  # a quack-kernels version whose GemmConfig has other fields
        logger.warning("%s: %s does not fit this quack-kernels version (%s); using its default config",
                       GEMM_CONFIGS.name, config_key(capability, gemm, n, k), error)
        return None


_capability = functools.cache(torch.cuda.get_device_capability)


def _config(gemm: str, a: torch.Tensor, b: torch.Tensor):
    return pinned_config(_capability(a.device), gemm, b.shape[-1], a.shape[-1])


@torch.library.custom_op("sft::swiglu_mlp_fwd", mutates_args=(), device_types="cuda")
def swiglu_mlp_fwd(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, d], w_gate_up [2f, d] (gate and up rows interleaved), w_down [d, f] → out [T, d],
    preact [T, 2f] (interleaved like w_gate_up; kept for the backward)."""
    b = w_gate_up.T
    preact, postact = _gemm().gemm_gated(x, b, activation="swiglu", tuned=False, config=_config("gated", x, b))
    return postact @ w_down.T, preact


@swiglu_mlp_fwd.register_fake
def _swiglu_mlp_fwd_fake(x, w_gate_up, w_down):
    return x.new_empty((x.shape[0], w_down.shape[0])), x.new_empty((x.shape[0], w_gate_up.shape[0]))


@torch.library.custom_op("sft::swiglu_mlp_bwd", mutates_args=(), device_types="cuda")
def swiglu_mlp_bwd(
    dout: torch.Tensor, x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, preact: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dout = dout.contiguous()
    # dout @ W_down gives d(product); the epilogue turns it into d(preact) and recomputes the product.
    dpreact, postact = _gemm().gemm_dgated(dout, w_down, preact, activation="swiglu", dynamic_scheduler=True,
                                           tuned=False, config=_config("dgated", dout, w_down))
    return dpreact @ w_gate_up, dpreact.T @ x, dout.T @ postact


@swiglu_mlp_bwd.register_fake
def _swiglu_mlp_bwd_fake(dout, x, w_gate_up, w_down, preact):
    return torch.empty_like(x), torch.empty_like(w_gate_up), torch.empty_like(w_down)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs, output[1])


def _backward(ctx, dout, _dpreact):
    return swiglu_mlp_bwd(dout, *ctx.saved_tensors)


swiglu_mlp_fwd.register_autograd(_backward, setup_context=_setup_context)


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """down(silu(x @ gate.T) * (x @ up.T)) for x [..., d] in the autocast dtype (the weights' dtype
    without autocast); the weights may be fp32 masters, cast here as autocast would."""
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else gate.dtype
    w_gate_up = torch.stack([gate, up], dim=1).flatten(0, 1).to(dtype)  # rows gate_0, up_0, gate_1, ...
    out, _ = swiglu_mlp_fwd(x.reshape(-1, x.shape[-1]).to(dtype), w_gate_up, down.to(dtype))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _fused_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


def fusable(mlp: torch.nn.Module) -> bool:
    """A stock Llama MLP: plain bias-free Linear gate/up/down with SiLU (not LoRA-wrapped)."""
    linears = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    return act == "silu" and all(type(linear) is torch.nn.Linear and linear.bias is None for linear in linears)


def use_fused_swiglu(mlps: list[torch.nn.Module]) -> int:
    """Route each fusable MLP's forward through swiglu_mlp (instance methods; no class is patched)."""
    fused = [mlp for mlp in mlps if fusable(mlp)]
    for mlp in fused:
        mlp.forward = types.MethodType(_fused_mlp_forward, mlp)
    return len(fused)
