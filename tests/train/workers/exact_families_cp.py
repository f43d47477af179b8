"""Worker for test_exact_families: each family of tests/train/families.py under context parallelism
(Ulysses over 2 ranks, gloo, fp32 CPU, block-diagonal sdpa): the summed slice losses and gradients equal the
one-rank packed run's (loss 1e-5, gradients 1e-4), which test_exact_families proves equal to transformers'
eager per document. Sliding windows and (gpt-oss) per-head sinks included: each rank holds half the heads,
so it must use its heads' sinks. Documents cross the rank boundary. Prints "<family> ok" per family."""
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from tests.train.families import FAMILIES, family_config
from train.dataset.packing import collate_packed
from train.kernels import context_parallel
from train.kernels.attention import setup_attention

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cp = context_parallel.setup(world, world, rank, 4, 2)
plain = setup_attention("sdpa", "cpu", packed=True)
ulysses = context_parallel.register_attention(plain, cp)
generator = torch.Generator().manual_seed(2)
docs = [torch.randint(0, 128, (n,), generator=generator).tolist() for n in (13, 3, 9)]  # 25 tokens, padded to 26
full = collate_packed([{"input_ids": d, "labels": d} for d in docs])
mine = cp.shard(full)
count = int((full["labels"][..., 1:] != -100).sum())


def build(family: str, attn: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(family), attn_implementation=attn, dtype=torch.float32)
    for layer in model.model.layers:
        if hasattr(layer.self_attn, "sinks"):  # zero-initialised; values per head that differ
            torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    return model.train()


for family in FAMILIES:
    ref = build(family, plain)
    ref_loss = ref(**full, num_items_in_batch=count).loss
    ref_loss.backward()
    model = build(family, ulysses)
    loss = model(**mine, num_items_in_batch=count).loss
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed)
    assert abs(summed.item() - ref_loss.item()) < 1e-5, (family, summed.item(), ref_loss.item())
    for (name, param), want in zip(model.named_parameters(), ref.parameters()):
        grad = param.grad.clone()
        dist.all_reduce(grad)
        assert (grad - want.grad).abs().max().item() < 1e-4, (family, name)
    print(f"rank {rank} {family} ok", flush=True)
dist.destroy_process_group()
