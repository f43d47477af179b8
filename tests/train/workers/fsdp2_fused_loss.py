"""Worker for test_fsdp2_fused_loss: FSDP2 sharded exactly as Accelerate 1.15 shards a Llama (decoder
layers; embedding; a "tail" unit of final norm + lm_head with reshard_after_forward=False; root),
fused loss on (both the CPU default "chunked" and the CUDA default "fused", here eager), gradients
compared with the stock model's. Run under torchrun with 2 ranks (gloo)."""
import copy, os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM
from train.kernels.perf import use_fused_loss
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
# head_alone: lm_head a unit by itself, as Accelerate shards a peft-wrapped model (no final norm found).
cases = [(tied, head_alone, backend) for tied, head_alone in ((False, False), (True, False), (False, True))
         for backend in ("chunked", "fused")]
for tied, head_alone, backend in cases:
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    ref = LlamaForCausalLM(cfg)
    model = copy.deepcopy(ref)
    use_fused_loss(model, backend)
    for layer in model.model.layers:
        fully_shard(layer)
    emb, head = model.model.embed_tokens, model.lm_head
    if head_alone:
        fully_shard(emb)
        fully_shard(head, reshard_after_forward=False)
    elif not tied:
        fully_shard(emb)
        fully_shard([model.model.norm, head], reshard_after_forward=False)
    else:
        fully_shard([model.model.norm, emb, head], reshard_after_forward=False)
    fully_shard(model)
    ids = torch.randint(0, 300, (1, 40))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    rloss = ref(input_ids=ids, labels=ids).loss
    rloss.backward()
    worst = 0.0
    for (n, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        g = p.grad.full_tensor()
        worst = max(worst, (g - rp.grad).abs().max().item())
    assert abs(loss.item() - rloss.item()) < 1e-6 and worst < 1e-6, (tied, head_alone, backend, loss.item(), rloss.item(), worst)
    print(f"rank {rank} tied={tied} head_alone={head_alone} {backend} ok", flush=True)
dist.destroy_process_group()
