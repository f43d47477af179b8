"""Worker for test_expert_parallel: a tiny Qwen3-MoE (8 experts, top-2) with its experts split over every
rank (train/moe/expert_parallel.py), sharded as training shards it (FSDP2: each experts module a group
of its own, then the decoder layers, then the root), against the same model on one rank with transformers'
own MoE forward (EP 1). Run under torchrun with 2 or 4 gloo ranks.

Each rank holds one row of its own; the one-rank reference reads all of them. Twice: with the seed's router,
where the loads are uneven and some experts get no token (checked: the test would prove less otherwise),
and with layer 0's router made to never pick experts 4-7, so the last rank's experts get no token at all.
Checked on every rank, in fp32: the ranks' losses, each over (label tokens / world) as the training loop
scales them, average to the one-rank loss (1e-5); every gradient, experts included, equals the one-rank
gradient (1e-4); the idle experts' gradients are zero; an eval forward (no_grad) gives the same loss.
"""
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from train.moe import expert_parallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ARCH = dict(vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, max_position_embeddings=64, tie_word_embeddings=False)
TOKENS = 8  # over all ranks (16 expert choices for 8 experts): loads are uneven, some experts get none
ep = expert_parallel.setup(world, world, rank, ARCH["num_experts"])


def build(starve: bool) -> Qwen3MoeForCausalLM:
    """The model; `starve`: layer 0's router never picks experts 4-7 (the last rank's, with 4 ranks the
    last two ranks'): rows 0-3 are c u, -c u, c v, -c v, so two of their logits are > 0 for any token,
    and rows 4-7 are zero (logit 0)."""
    torch.manual_seed(1)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**ARCH, attn_implementation="sdpa"))
    if starve:
        u, v = torch.randn(2, ARCH["hidden_size"])
        with torch.no_grad():
            model.model.layers[0].mlp.gate.weight.copy_(torch.stack([u, -u, v, -v, *[0 * u] * 4]) * 10)
    return model


torch.manual_seed(0)
ids = torch.randint(0, 300, (world, TOKENS // world))
labels = ids.clone()
labels[:, 0] = -100
count = int((labels[..., 1:] != -100).sum())

for starve in (False, True):
    loads = []
    ref = build(starve)
    for block in expert_parallel.moe_blocks(ref):
        block.gate.register_forward_hook(lambda m, i, out: loads.append(torch.bincount(out[2].reshape(-1), minlength=8)))
    ref_loss = ref(input_ids=ids, labels=labels).loss
    ref_loss.backward()
    idle = [(layer, e) for layer, load in enumerate(loads) for e in range(8) if load[e] == 0]
    assert idle and any(len(set(load.tolist())) > 2 for load in loads), loads  # idle experts, uneven loads
    if starve:
        assert all((0, e) in idle for e in range(4, 8)), loads
    expected = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in ref.named_parameters()}

    model = build(starve)
    assert expert_parallel.apply(model, ep) == 2
    for layer in model.model.layers:
        fully_shard(layer.mlp.experts)
        fully_shard(layer)
    fully_shard(model)
    mine = dict(input_ids=ids[rank:rank + 1], labels=labels[rank:rank + 1])
    loss = model(**mine, num_items_in_batch=count / world).loss
    loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= world
    assert abs(mean.item() - ref_loss.item()) < 1e-5, (mean.item(), ref_loss.item())
    worst = {}
    for name, param in model.named_parameters():
        grad = param.grad.full_tensor()
        worst[name] = (grad - expected[name]).abs().max().item()
    assert max(worst.values()) < 1e-4, sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    for layer, e in idle:
        experts = model.model.layers[layer].mlp.experts
        assert not experts.gate_up_proj.grad.full_tensor()[e].any() and not experts.down_proj.grad.full_tensor()[e].any()
    with torch.no_grad():
        again = model(**mine, num_items_in_batch=count / world).loss
    dist.all_reduce(again)
    assert abs(again.item() / world - ref_loss.item()) < 1e-5
    print(f"rank {rank} of {world} starve={starve} loss {mean.item():.6f} = {ref_loss.item():.6f}, {len(idle)} idle experts ok", flush=True)
dist.destroy_process_group()
