"""One mixture-of-experts layer's experts, forward + backward, per implementation: transformers' own loop
(`eager`: two small matmuls per expert), transformers' `grouped_mm` (torch's grouped GEMM), and ours
(`sft_grouped`, train/moe/experts.py: the same grouped GEMM, fp32-promoted combine); then LoRA r 16 on both
expert weights: PEFT's `target_parameters` (it folds W + B·A into a full-size weight at every forward, then
transformers' `grouped_mm`) against ours (the adapters at rank r inside the grouped GEMMs).
(`batched_mm` gathers a [tokens·k, 2I, H] weight per call: 400 GB at the 30B shape, so it is not run.)

    python -m bench.kernels.gpu_moe_experts                      # Qwen3-30B-A3B's layer, 8192 tokens, bf16
    python -m bench.kernels.gpu_moe_experts --cpu-smoke --json   # tiny, fp32, one iteration: proves it runs

Prints a table (or with --json one JSON line of the rows). A row that fails records its error.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from transformers import Qwen3MoeConfig
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

# Qwen/Qwen3-30B-A3B's config.json: the layer's shape.
LAYER_30B = dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True)
LAYER_TINY = dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
IMPLEMENTATIONS = ("eager", "grouped_mm", "sft_grouped")


class _Holder(torch.nn.Module):
    """PEFT injects into a module tree: the block under the name a decoder layer gives it (`mlp`)."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.mlp = block


def timed(step, device: torch.device, warmup: int, iters: int) -> float:
    """Milliseconds per call of `step` after `warmup` calls."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def rows(layer: dict, tokens: int, device: torch.device, dtype: torch.dtype, warmup: int, iters: int) -> list[dict]:
    from peft import LoraConfig, inject_adapter_in_model

    from train.moe.hf import adapt_experts_in_place, register

    register()
    torch.manual_seed(0)
    config = Qwen3MoeConfig(**layer)
    block = Qwen3MoeSparseMoeBlock(config).to(device=device, dtype=dtype)
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    x = torch.randn(1, tokens, layer["hidden_size"], device=device, dtype=dtype, requires_grad=True)

    def step():
        block(x).float().square().mean().backward()

    out = []

    def measure(name: str, impl: str) -> None:
        config._experts_implementation = impl
        try:
            out.append({"row": name, "implementation": impl, "ms": timed(step, device, warmup, iters)})
        except Exception as error:  # noqa: BLE001 — a kernel that cannot run here is a row with its error
            out.append({"row": name, "implementation": impl, "error": f"{type(error).__name__}: {error}"[:300]})
    for impl in IMPLEMENTATIONS:
        measure(f"experts {impl}", impl)
    holder = _Holder(block)
    block.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, target_modules=[],
                                       target_parameters=["experts.gate_up_proj", "experts.down_proj"]), holder)
    measure("LoRA r16 on the experts: PEFT fold", "grouped_mm")
    adapt_experts_in_place(holder)  # no-op unless the experts dispatch to us: set it first
    config._experts_implementation = "sft_grouped"
    adapt_experts_in_place(holder)
    measure("LoRA r16 on the experts: ours", "sft_grouped")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = parser.parse_args()
    cpu = args.cpu_smoke or not torch.cuda.is_available()
    device = torch.device("cpu" if cpu else "cuda")
    layer = LAYER_TINY if args.cpu_smoke else LAYER_30B
    tokens, warmup, iters = (64, 0, 1) if args.cpu_smoke else (args.tokens, 3, args.iters)
    table = rows(layer, tokens, device, torch.float32 if cpu else torch.bfloat16, warmup, iters)
    record: dict[str, Any] = {"device": torch.cuda.get_device_name() if not cpu else "cpu", "shape": layer,
                              "tokens": tokens, "rows": table}
    if args.json:
        print(json.dumps(record))
        return
    print(f"{record['device']}, one layer's experts, {tokens} tokens, forward + backward")
    print("| experts | ms |\n|---|---|")
    for row in table:
        print(f"| {row['row']} | {row.get('ms', 0):.2f} |" if "ms" in row else f"| {row['row']} | {row['error']} |")


if __name__ == "__main__":
    main()
