"""Worker for test_fsdp2_last_layer (tests/train/workers/loop_watch.py runs the real loop on 2 gloo ranks under
FSDP2): around every micro-batch's backward this rank records which decoder layers hold their gathered (unsharded)
weights: a resharded layer's parameters are DTensor shards, a gathered one's plain tensors. One record per
micro-batch, {"before": [...], "after": [...], "layers": N}, in RUN/gathered-rank<r>.json. Usage: RUN_DIR"""
from torch.distributed.tensor import DTensor

from loop_watch import run_watching_backward
from train.kernels.perf import decoder_layers


def gathered_layers(model) -> list[int]:
    layers = decoder_layers(model)
    return [i for i, layer in enumerate(layers) if not any(isinstance(p, DTensor) for p in layer.parameters())]


def watch(model, backward, last_micro_batch):
    before = gathered_layers(model)  # the forward and the loss are done
    backward()
    return {"before": before, "after": gathered_layers(model), "layers": len(decoder_layers(model))}


run_watching_backward(watch, "gathered")
