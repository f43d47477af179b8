"""Worker for test_expert_parallel: a tiny Qwen3-MoE (8 experts, top-2) with its experts split over every
rank (train/moe/expert_parallel.py), sharded as training shards it (FSDP2: each experts module a group
of its own, then the decoder layers, then the root), against the same model on one rank with transformers'
own MoE forward (EP 1). Run under torchrun with 2 or 4 gloo ranks; the EP size as argument (default: every
rank; fewer: each rank all-gathers its EP index's experts from the FSDP shards of its replica group).

Three cases, each rank with tokens of its own and the one-rank reference reading all of them:
- "uneven": a row per rank, the seed's router: uneven loads and experts that get no token (checked: the
  test would prove less otherwise);
- "starved": layer 0's router made to never pick experts 4-7, so the last rank's experts get no token;
- "context": EP composed with context parallelism (train/kernels/context_parallel.py) over the same ranks:
  one packed row of documents, each rank a slice, attention by Ulysses' all-to-all.
Checked on every rank, in fp32: the ranks' losses, each over (label tokens / world) as the training loop
scales them, average to the one-rank loss (1e-5); every gradient, experts included, equals the one-rank
gradient (1e-4); the idle experts' gradients are zero; an eval forward (no_grad) gives the same loss.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from train.dataset.packing import collate_packed
from train.kernels import context_parallel
from train.kernels.attention import setup_attention
from train.moe import expert_parallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ARCH = dict(vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, max_position_embeddings=64, tie_word_embeddings=False)
TOKENS = 8  # over all ranks (16 expert choices for 8 experts): loads are uneven, some experts get none
size = int(sys.argv[1]) if len(sys.argv) > 1 else world
ep = expert_parallel.setup(size, world, rank, ARCH["num_experts"])
cp = context_parallel.setup(world, world, rank, ARCH["num_attention_heads"], ARCH["num_key_value_heads"])
packed_attention = setup_attention("sdpa", torch.device("cpu"), packed=True)
ulysses = context_parallel.register_attention(packed_attention, cp)


def build(starve: bool, attention: str) -> Qwen3MoeForCausalLM:
    """The model; `starve`: layer 0's router never picks experts 4-7 (the last rank's, with 4 ranks the
    last two ranks'): rows 0-3 are c u, -c u, c v, -c v, so two of their logits are > 0 for any token,
    and rows 4-7 are zero (logit 0)."""
    torch.manual_seed(1)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**ARCH, attn_implementation=attention))
    if starve:
        u, v = torch.randn(2, ARCH["hidden_size"])
        with torch.no_grad():
            model.model.layers[0].mlp.gate.weight.copy_(torch.stack([u, -u, v, -v, *[0 * u] * 4]) * 10)
    return model


def batches(case: str) -> tuple[dict, dict, int]:
    """(the one-rank batch, this rank's part of it, label tokens in all)."""
    torch.manual_seed(0)
    if case == "context":  # documents of 3 and 5 tokens packed in one row, a slice per rank
        docs = [torch.randint(0, 300, (n,)).tolist() for n in (3, 5)]
        full = collate_packed([{"input_ids": d, "labels": d} for d in docs])
        return full, cp.shard(full), int((full["labels"][..., 1:] != -100).sum())
    ids = torch.randint(0, 300, (world, TOKENS // world))
    labels = ids.clone()
    labels[:, 0] = -100
    full = dict(input_ids=ids, labels=labels)
    return full, dict(input_ids=ids[rank:rank + 1], labels=labels[rank:rank + 1]), int((labels[..., 1:] != -100).sum())


def reference(case: str, full: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[tuple[int, int]]]:
    """The one-rank loss, gradients and idle (layer, expert) pairs, transformers' MoE forward."""
    model = build(case == "starved", packed_attention if case == "context" else "sdpa")
    loads = []
    for block in expert_parallel.moe_blocks(model):
        block.gate.register_forward_hook(lambda m, i, out: loads.append(torch.bincount(out[2].reshape(-1), minlength=8)))
    loss = model(**full).loss
    loss.backward()
    idle = [(layer, e) for layer, load in enumerate(loads) for e in range(8) if load[e] == 0]
    assert any(len(set(load.tolist())) > 2 for load in loads), loads  # uneven loads
    assert idle or case == "context", loads  # experts that get no token
    assert case != "starved" or all((0, e) in idle for e in range(4, 8)), loads
    return loss.detach(), {n: p.grad if p.grad is not None else torch.zeros_like(p)
                           for n, p in model.named_parameters()}, idle


for case in ("uneven", "starved", "context"):
    full, mine, count = batches(case)
    ref_loss, expected, idle = reference(case, full)
    model = build(case == "starved", ulysses if case == "context" else "sdpa")
    assert expert_parallel.apply(model, ep) == 2
    for layer in model.model.layers:
        fully_shard(layer.mlp.experts)
        fully_shard(layer)
    fully_shard(model)
    loss = model(**mine, num_items_in_batch=count / world).loss
    loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    assert abs(mean.item() / world - ref_loss.item()) < 1e-5, (case, mean.item() / world, ref_loss.item())
    worst = {name: (param.grad.full_tensor() - expected[name]).abs().max().item()
             for name, param in model.named_parameters()}
    assert max(worst.values()) < 1e-4, (case, sorted(worst.items(), key=lambda kv: -kv[1])[:3])
    for layer, e in idle:
        experts = model.model.layers[layer].mlp.experts
        assert not experts.gate_up_proj.grad.full_tensor()[e].any() and not experts.down_proj.grad.full_tensor()[e].any()
    with torch.no_grad():
        again = model(**mine, num_items_in_batch=count / world).loss
    dist.all_reduce(again)
    assert abs(again.item() / world - ref_loss.item()) < 1e-5
    print(f"rank {rank} of {world}, EP {size}, {case}: loss {mean.item() / world:.6f} = {ref_loss.item():.6f}, "
          f"{len(idle)} idle experts ok", flush=True)
dist.destroy_process_group()
