"""The Llama MLP, down(silu(gate(x)) * up(x)), with SwiGLU computed inside the GEMMs (quack's CuTe
DSL kernels, Hopper and Blackwell; `quack-kernels` comes with flash-attn-4).

Why: on the 1B shape the SwiGLU product and its gradient are separate elementwise passes over
[tokens, ffn] tensors, about a tenth of a step at the memory-bandwidth roof (BENCHMARKS.md #13).
Here the forward GEMM writes the gate/up pre-activation and the product in its epilogue, and the
backward's first GEMM (dout @ W_down) applies the SwiGLU gradient and recomputes the product in
its epilogue, so no elementwise kernel runs and the product is not kept for the backward.

Like train/fa4.py, forward and backward are `torch.library.custom_op`s with fake implementations:
the compiled decoder layer keeps each as one call and never traces into quack's Python launchers.
The gate and up weights stay separate parameters (checkpoints, sharding and export see the stock
model); they are concatenated [gate; up] per call, which costs one small copy per layer.
"""

from __future__ import annotations

import functools
import importlib
import types

import torch

from contract.gpus import fused_mlp_blocker


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
    for name in ("gemm", "gemm_gated", "gemm_dgated"):
        if not hasattr(gemm, name):
            return f"this quack-kernels version has no quack.gemm_interface.{name}"
    return None


def unavailable(device: torch.device, lora: bool = False, zero_stage: int | None = None) -> str | None:
    """None when the fused SwiGLU MLP can run on `device` in this job, else why not (one line)."""
    on_gpu = device.type == "cuda" and torch.cuda.is_available()
    capability = torch.cuda.get_device_capability(device) if on_gpu else None
    return fused_mlp_blocker(on_gpu, capability, lora, zero_stage) or import_problem()


@torch.library.custom_op("sft::swiglu_mlp_fwd", mutates_args=(), device_types="cuda")
def swiglu_mlp_fwd(
    x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, tuned: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, d], w_gate_up [2f, d] ([gate; up]), w_down [d, f] → out [T, d], preact [T, 2f] (kept for backward).
    `tuned`: quack's autotuner instead of its default configs. Training never asks for it (it re-tunes
    for minutes at every new token count); bench/gpu_mlp.py measures what it would gain."""
    gemm = _gemm()
    preact, postact = gemm.gemm_gated(x, w_gate_up.T, activation="swiglu", concat_layout=("B",), tuned=tuned)
    return gemm.gemm(postact, w_down.T, tuned=tuned), preact


@swiglu_mlp_fwd.register_fake
def _swiglu_mlp_fwd_fake(x, w_gate_up, w_down, tuned):
    return x.new_empty((x.shape[0], w_down.shape[0])), x.new_empty((x.shape[0], w_gate_up.shape[0]))


@torch.library.custom_op("sft::swiglu_mlp_bwd", mutates_args=(), device_types="cuda")
def swiglu_mlp_bwd(
    dout: torch.Tensor, x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, preact: torch.Tensor,
    tuned: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gemm = _gemm()
    dout = dout.contiguous()
    # dout @ W_down gives d(product); the epilogue turns it into d(preact) and recomputes the product.
    dpreact, postact = gemm.gemm_dgated(dout, w_down, preact, activation="swiglu", dynamic_scheduler=True, tuned=tuned)
    dw_down = gemm.gemm(dout.T, postact, dynamic_scheduler=True, tuned=tuned)
    dx = gemm.gemm(dpreact, w_gate_up, concat_layout=("B",), dynamic_scheduler=True, tuned=tuned)
    dw_gate_up = gemm.gemm(dpreact.T, x, concat_layout=("out",), dynamic_scheduler=True, tuned=tuned)
    return dx, dw_gate_up, dw_down


@swiglu_mlp_bwd.register_fake
def _swiglu_mlp_bwd_fake(dout, x, w_gate_up, w_down, preact, tuned):
    return torch.empty_like(x), torch.empty_like(w_gate_up), torch.empty_like(w_down)


def _setup_context(ctx, inputs, output) -> None:
    x, w_gate_up, w_down, ctx.tuned = inputs
    ctx.save_for_backward(x, w_gate_up, w_down, output[1])


def _backward(ctx, dout, _dpreact):
    x, w_gate_up, w_down, preact = ctx.saved_tensors
    return *swiglu_mlp_bwd(dout, x, w_gate_up, w_down, preact, ctx.tuned), None


swiglu_mlp_fwd.register_autograd(_backward, setup_context=_setup_context)


def swiglu_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
               tuned: bool = False) -> torch.Tensor:
    """down(silu(x @ gate.T) * (x @ up.T)) for x [..., d] in the autocast dtype (the weights' dtype
    without autocast); the weights may be fp32 masters, cast here as autocast would."""
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else gate.dtype
    w_gate_up = torch.cat([gate, up]).to(dtype)
    out, _ = swiglu_mlp_fwd(x.reshape(-1, x.shape[-1]).to(dtype), w_gate_up, down.to(dtype), tuned)
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
