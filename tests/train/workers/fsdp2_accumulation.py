"""Worker for test_fsdp2_accumulation: one rank started by `accelerate launch --config_file RUN/accelerate.yaml`
(FSDP2 over gloo, 2 processes; tests/train/workers/loop_watch.py runs the real loop): after every micro-batch's
backward this rank records where the gradients are:
  unsharded: FSDP parameters holding an unsharded gradient, i.e. one not reduce-scattered yet (FSDP2 keeps it
             on FSDPParam.unsharded_accumulated_grad when the reduce dtype differs from the parameter's,
             else on the unsharded parameter's .grad);
  sharded:   trainable (sharded) parameters holding a gradient, i.e. one a reduce-scatter wrote.
Rank r writes them, one record per micro-batch, to RUN/gradients-rank<r>.json. Usage: RUN_DIR"""
from torch.distributed.fsdp import FSDPModule

from loop_watch import run_watching_backward


def unsharded_gradients(model) -> int:
    # One state per fully_shard call: final norm + lm_head share one (Accelerate shards them together).
    states = {id(state): state for state in (module._get_fsdp_state() for module in model.modules()
                                             if isinstance(module, FSDPModule))}
    held = 0
    for param in (param for state in states.values() for group in state._fsdp_param_groups
                  for param in group.fsdp_params):
        unsharded = getattr(param, "_unsharded_param", None)  # absent before the first all-gather
        held += param.unsharded_accumulated_grad is not None or (unsharded is not None and unsharded.grad is not None)
    return held


def watch(model, backward, last_micro_batch):
    backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {"last": last_micro_batch, "unsharded": unsharded_gradients(model),
            "sharded": sum(p.grad is not None for p in trainable), "trainable": len(trainable)}


run_watching_backward(watch, "gradients")
