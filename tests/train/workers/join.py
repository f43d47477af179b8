"""What the context-parallel workers share: the backend argument and this rank's place in the group."""
import os

import torch
import torch.distributed as dist


def join_group(argv: list[str]) -> tuple[str, bool, torch.device, int, int]:
    """(backend, on_gpu, device, rank, world): sdpa (the default) on CPU over gloo; an attention backend
    (fa4, varlen, flash_attn) on this rank's GPU over NCCL."""
    backend = argv[1] if len(argv) > 1 else "sdpa"
    on_gpu = backend != "sdpa"
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    return backend, on_gpu, device, dist.get_rank(), dist.get_world_size()
