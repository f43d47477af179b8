"""Worker for test_exact_families (CPU) and test_gpu_exact (GPUs): each family of tests/train/families.py under
context parallelism (Ulysses over 2 ranks): the summed slice losses and gradients equal the one-rank packed
run's. CPU: gloo, fp32, block-diagonal sdpa, loss 1e-5 and gradients 1e-4 (and test_exact_families proves the
one-rank run equal to transformers' eager per document). GPUs (a backend as argument: fa4, varlen, flash_attn):
NCCL, bf16 autocast, bf16's tolerances, head_dim 64. Sliding windows and (gpt-oss) per-head sinks included:
each rank holds half the heads, so it must use its heads' sinks. Documents cross the rank boundary. Prints
"<family> ok" per family, or "<family> skip" where the backend cannot compute the family's features."""
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from contract.attention import AttentionFeatures
from contract.schema import ConfigError
from tests.train.families import FAMILIES, SPECS, family_config
from tests.train.workers.join import join_group
from train.dataset.packing import collate_packed
from train.kernels import context_parallel
from train.kernels.attention import setup_attention

backend, on_gpu, device, rank, world = join_group(sys.argv)
LOSS_TOL, GRAD_TOL = (2e-2, 5e-2) if on_gpu else (1e-5, 1e-4)  # GPU: relative to the loss / largest gradient
SHAPE = dict(hidden_size=256, head_dim=64, intermediate_size=512, vocab_size=512) if on_gpu else {}
cp = context_parallel.setup(world, world, rank, 4, 2)
generator = torch.Generator().manual_seed(2)
lengths = (150, 37, 90) if on_gpu else (13, 3, 9)  # padded to a multiple of 2: the first crosses the boundary
docs = [torch.randint(0, SHAPE.get("vocab_size", 128), (n,), generator=generator).tolist() for n in lengths]
cpu_full = collate_packed([{"input_ids": d, "labels": d} for d in docs])
full = {k: v.to(device) if torch.is_tensor(v) else v for k, v in cpu_full.items()}
mine = {k: v.to(device) if torch.is_tensor(v) else v for k, v in cp.shard(cpu_full).items()}
count = int((cpu_full["labels"][..., 1:] != -100).sum())


def config_of(family: str):
    window = {"sliding_window": 48} if on_gpu and "sliding_window" in SPECS[family][1] else {}
    return family_config(family, **SHAPE, **window)


def build(family: str, attn: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_of(family), attn_implementation=attn, dtype=torch.float32)
    for layer in model.model.layers:
        if hasattr(layer.self_attn, "sinks"):  # zero-initialised; values per head that differ
            torch.nn.init.normal_(layer.self_attn.sinks, std=1.0)
    return model.to(device).train()


def loss_of(model, batch, items):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu):
        return model(**batch, num_items_in_batch=items).loss


for family in FAMILIES:
    try:
        plain = setup_attention(backend, device, packed=True,
                                features=AttentionFeatures.from_config(config_of(family).to_dict()))
    except ConfigError as error:  # refused in one line: the backend cannot compute a feature of this family
        print(f"rank {rank} {family} skip ({error})", flush=True)
        continue
    ulysses = context_parallel.register_attention(plain, cp)
    ref = build(family, plain)
    ref_loss = loss_of(ref, full, count)
    ref_loss.backward()
    model = build(family, ulysses)
    loss = loss_of(model, mine, count)
    loss.backward()
    summed = loss.detach().clone()
    dist.all_reduce(summed)
    assert abs(summed.item() - ref_loss.item()) < LOSS_TOL * (ref_loss.item() if on_gpu else 1), (
        family, summed.item(), ref_loss.item())
    for (name, param), want in zip(model.named_parameters(), ref.parameters()):
        grad = param.grad.clone()
        dist.all_reduce(grad)
        scale = want.grad.abs().max().item() if on_gpu else 1.0
        assert (grad - want.grad).abs().max().item() <= GRAD_TOL * max(scale, 1e-12), (family, name)
    print(f"rank {rank} {family} ok", flush=True)
dist.destroy_process_group()
