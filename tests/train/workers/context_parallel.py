"""Worker for test_context_parallel: the context-parallel (Ulysses) forward and backward on a packed batch of
documents of several lengths, one of them across a rank boundary, against the same model on one rank.
Run under torchrun with 2 or 4 ranks (gloo): every rank is one CP group of the whole world.

Checked on every rank, for the stock loss and the fused (chunked) one, with 4 query / 2 KV heads (2 ranks:
the KV heads split; 4 ranks: each KV head repeated), in fp32 on CPU (gloo, block-diagonal sdpa); with an
attention backend as argument (fa4, varlen, flash_attn: tests/train/test_gpu_context_parallel.py) on GPUs
over NCCL in bf16, where the tolerances are bf16's (matmuls over a slice's rows round differently):
1. plain replicas: Σ over ranks of each slice's loss == the one-rank loss (1e-5), Σ of their gradients ==
   the one-rank gradients (1e-4);
2. FSDP2 (fully_shard over the world, as training shards): the loss of each slice over (label tokens / world),
   averaged by FSDP's reduce-scatter, gives the one-rank gradients.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

from tests.train.workers.join import join_group
from train.dataset.packing import collate_packed
from train.kernels import context_parallel
from train.kernels.attention import setup_attention
from train.kernels.perf import use_fused_loss

backend, on_gpu, device, rank, world = join_group(sys.argv)
dtype = torch.bfloat16 if on_gpu else torch.float32
LOSS_TOL, GRAD_TOL = (2e-2, 5e-2) if on_gpu else (1e-5, 1e-4)  # GPU: relative to the largest gradient
cp = context_parallel.setup(world, world, rank, 4, 2)
torch.manual_seed(0)
hidden = 256 if on_gpu else 64  # head_dim 64 on GPUs, a size every FlashAttention kernel takes
arch = dict(vocab_size=300, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
# 71 tokens: padded to 72; with 2 ranks the 29-token document crosses the boundary at 36, with 4 at 18/36/54.
lengths = [13, 29, 7, 22]
docs = [torch.randint(0, 300, (n,)).tolist() for n in lengths]
examples = [{"input_ids": d, "labels": [t if i % 5 else -100 for i, t in enumerate(d)]} for d in docs]
cpu_full = collate_packed(examples)
mine = {k: v.to(device) if torch.is_tensor(v) else v for k, v in cp.shard(cpu_full).items()}
full = {k: v.to(device) if torch.is_tensor(v) else v for k, v in cpu_full.items()}
assert mine["input_ids"].shape[-1] * world == 72, mine["input_ids"].shape
count = int((full["labels"][..., 1:] != -100).sum())
total = torch.tensor(context_parallel.label_tokens(mine), device=device)
dist.all_reduce(total)
assert int(total) == count, (int(total), count)

plain = setup_attention(backend, device, packed=True)
ulysses = context_parallel.register_attention(plain, cp)


def build(fused: bool, attn: str) -> LlamaForCausalLM:
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**arch, attn_implementation=attn)).to(device, dtype)
    if fused:
        use_fused_loss(model, "chunked")
    return model


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float()
            for n, p in model.named_parameters()}


def error(grad: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference, on GPUs relative to the largest gradient of the tensor."""
    scale = want.abs().max().item() if on_gpu else 1.0
    return (grad - want).abs().max().item() / max(scale, 1e-12)


for fused in (False, True):
    ref = build(fused, plain)
    ref_loss = ref(**full, num_items_in_batch=count).loss
    ref_loss.backward()
    expected = grads(ref)

    replica = build(fused, ulysses)
    loss = replica(**mine, num_items_in_batch=count).loss
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed)
    assert abs(summed.item() - ref_loss.item()) < LOSS_TOL * (ref_loss.item() if on_gpu else 1), (
        fused, summed.item(), ref_loss.item())
    worst = 0.0
    for name, grad in grads(replica).items():
        dist.all_reduce(grad)
        worst = max(worst, error(grad, expected[name]))
    assert worst < GRAD_TOL, (fused, "replicas", worst)

    sharded = build(fused, ulysses)
    for layer in sharded.model.layers:
        fully_shard(layer)
    fully_shard(sharded)
    sharded(**mine, num_items_in_batch=count / world).loss.backward()
    worst = max(error(grad, expected[name]) for name, grad in grads(sharded).items())
    assert worst < GRAD_TOL, (fused, "fsdp2", worst)
    print(f"rank {rank} of {world} fused={fused} loss {summed.item():.6f} = {ref_loss.item():.6f} ok", flush=True)
dist.destroy_process_group()
