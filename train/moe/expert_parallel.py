"""Expert parallelism (parallel.expert = N): the experts of every MoE layer split over the N ranks, each
token sent to the rank that holds its expert and back by two all-to-alls.

Layout. FSDP2 already stores every parameter as a DTensor sharded on dim 0 over the W ranks; an MoE
layer's fused expert tensors (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) have the experts on dim 0,
so when N = W divides E, FSDP's shard on rank r IS experts [r E/N, (r+1) E/N). We give each layer's experts
module an FSDP group of its own (`wrap_experts_apart`) and never call that module, so FSDP never all-gathers
it: the MoE block's forward (`_block_forward`) reads the local shard (`to_local()`) directly. Everything
FSDP does with parameters stays as it is: the rank-0 load and broadcast (cpu_ram_efficient_loading), the
DCP checkpoint and resume, the export's full state dict, the optimizer and the clip, all see the full
[E, ...] tensors, sharded as any other weight. With N < W (N dividing W): EP index i = r // R, R = W/N;
the R consecutive ranks iR .. iR+R-1 (a "replica group") hold experts [i E/N, (i+1) E/N) as their FSDP
shards and all-gather them (one collective per layer for both tensors; its backward reduce-scatters the
gradients); the EP groups are the strided ranks g, g+R, g+2R, ... (one rank of each EP index).

Dispatch, per MoE layer, on each rank: the router (replicated, FSDP-sharded like any weight) routes this
rank's tokens (transformers' own TopKRouter: fp32 softmax, top-k, optional renorm); the token copies are
sorted by expert; the per-expert counts are exchanged (all_to_all_single), then the hidden states with
those split sizes; the received tokens are grouped by local expert, run through the local experts, sent
back by the inverse all-to-all, unsorted, weighted by the router scores and summed over the k choices,
as transformers' Qwen3MoeExperts does. The local experts are train/moe/experts.py's grouped MLP (one
grouped GEMM per projection on GPUs). A rank whose experts get no token at all still takes part in both
all-to-alls' backward, and its expert shards get zero gradients, not none (`_keep_in_graph`).

Gradients. The training loss of each rank is scaled for FSDP's average over the W ranks
(train/engine/loop.py); an expert shard's gradient here is the SUM over every rank's tokens (its EP group's
tokens, summed over the replicas by the reduce-scatter), W times the average, and FSDP does not reduce it
(its group never ran): `_scale_grad` divides it by W.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from contract.parallel import expert_blocker, expert_sharding_blocker
from contract.schema import ConfigError
from train.moe.experts import grouped_expert_mlp

logger = logging.getLogger(__name__)

KEY = "parallel.expert"
# MoE blocks whose router and experts this module computes as transformers does (the forward it replaces).
SUPPORTED_BLOCKS = ("Qwen3MoeSparseMoeBlock",)


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place among the `size` ranks that split the experts (size 1: off)."""

    size: int = 1
    rank: int = 0  # this rank's EP index: it computes experts [rank E/size, (rank+1) E/size)
    group: Any = None  # the ProcessGroup of the EP ranks; None when off
    replicas: int = 1  # world / size: the consecutive ranks whose FSDP shards make up this rank's experts
    replica_group: Any = None  # their ProcessGroup (None when size = world: the shard is the experts)

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def world(self) -> int:
        return self.size * self.replicas


def setup(size: int, world: int, rank: int, experts: int | None, model_type: str | None = None) -> ExpertParallel:
    """EP over `size` ranks; a ConfigError (exit 2) when it cannot split these ranks or experts."""
    if size <= 1:
        return ExpertParallel()
    if blocker := expert_blocker(size, world, experts, model_type):
        raise ConfigError(f"{KEY}: {blocker}", KEY)
    replicas, index = world // size, rank // (world // size)
    logger.info("expert parallel: %d experts per MoE layer over %d ranks, %d each; rank %d computes experts %d-%d",
                experts, size, experts // size, rank, index * experts // size, (index + 1) * experts // size - 1)
    if replicas == 1:
        return ExpertParallel(size, rank, dist.group.WORLD)
    # Every rank creates every group (new_group's rule). EP groups: ranks g, g + R, g + 2R, ... (EP index i of
    # group g is rank g + iR); replica groups: the R consecutive ranks iR .. iR + R - 1, whose FSDP shards are
    # together experts [i E/size, (i+1) E/size).
    ep_groups = [dist.new_group(list(range(g, world, replicas))) for g in range(replicas)]
    replica_groups = [dist.new_group(list(range(i * replicas, (i + 1) * replicas))) for i in range(size)]
    return ExpertParallel(size, index, ep_groups[rank % replicas], replicas, replica_groups[index])


def moe_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE blocks (the modules holding fused `experts`), of whatever family."""
    return [m for m in model.modules() if getattr(getattr(m, "experts", None), "gate_up_proj", None) is not None]


def apply(model: torch.nn.Module, ep: ExpertParallel) -> int:
    """Route every MoE block of `model` through the EP dispatch; returns how many. A ConfigError when
    the model has a kind of MoE block this module does not compute as transformers does, or none."""
    blocks = moe_blocks(model)
    if not blocks:
        raise ConfigError(f"{KEY}: the model has no mixture-of-experts layer to split", KEY)
    if kinds := {type(b).__name__ for b in blocks} - set(SUPPORTED_BLOCKS):
        raise ConfigError(f"{KEY}: MoE block {sorted(kinds)[0]} is not supported (supported: "
                          f"{', '.join(SUPPORTED_BLOCKS)})", KEY)
    if wrapped := [b for b in blocks if not type(b.experts).__module__.startswith("transformers.")]:
        raise ConfigError(f"{KEY}: the experts are wrapped ({type(wrapped[0].experts).__name__}: LoRA on the "
                          "experts?), which expert parallelism does not support yet", KEY)
    for block in blocks:
        block.forward = _block_forward(block, ep)
    return len(blocks)


def split_experts(accelerator: Any, model: torch.nn.Module, ep: ExpertParallel) -> None:
    """Before `prepare`: every MoE block of `model` through the EP dispatch, every experts module an FSDP2
    group of its own. A ConfigError (exit 2) without FSDP2, which holds the experts' shards."""
    if not ep.enabled:
        return
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp import CPUOffloadPolicy

    fsdp2 = accelerator.distributed_type == DistributedType.FSDP and accelerator.is_fsdp2
    offload = fsdp2 and isinstance(accelerator.state.fsdp_plugin.cpu_offload, CPUOffloadPolicy)
    if blocker := expert_sharding_blocker(str(accelerator.distributed_type), fsdp2, offload):
        raise ConfigError(f"{KEY}: {blocker}", KEY)
    count = apply(model, ep)
    wrap_experts_apart(accelerator, model)
    logger.info("expert parallel: %d MoE layers dispatch their tokens by all-to-all over %d ranks", count, ep.size)


def wrap_experts_apart(accelerator: Any, model: torch.nn.Module) -> None:
    """Give every experts module an FSDP2 group of its own (Accelerate wraps the classes named in the
    plugin bottom-up, so the experts before their decoder layer), which EP never unshards."""
    plugin = accelerator.state.fsdp_plugin
    names = list(plugin.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None) or [])
    for block in moe_blocks(model):
        if (name := type(block.experts).__name__) not in names:
            names.append(name)
    plugin.transformer_cls_names_to_wrap = names


def _block_forward(block: torch.nn.Module, ep: ExpertParallel) -> Callable[[torch.Tensor], torch.Tensor]:
    """The MoE block's forward with its experts split over the EP ranks (transformers' routing)."""

    # Eager inside a torch.compile'd decoder layer (train.compile, "auto" on GPUs): its split sizes are data
    # (the routing), read on the host, and c10d's all-to-all would break the graph anyway; the experts' grouped
    # GEMMs gain nothing from it. The attention and norms around it stay compiled.
    @torch.compiler.disable
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = hidden_states.shape
        flat = hidden_states.reshape(-1, hidden)
        _, weights, indices = block.gate(flat)
        out = dispatch_combine(flat, indices, weights, block.experts, ep)
        return out.reshape(batch, length, hidden)

    return forward


def local_experts(experts: torch.nn.Module, ep: ExpertParallel, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's experts (gate_up, down) in `dtype`, their gradient divided by the world (see the module
    doc): FSDP2's local shards, with replicas all-gathered from the replica group (one collective for both
    tensors; its backward, a reduce-scatter, sums the replicas' gradients). A whole tensor here means FSDP
    gathered it with its layer (the experts not wrapped apart): its gradient would be reduced twice."""
    params = experts.gate_up_proj, experts.down_proj
    if not all(hasattr(p, "to_local") for p in params):
        raise RuntimeError("expert parallel: the experts are not FSDP2 shards of their own (wrap_experts_apart "
                           "before prepare, with the transformer-based wrap policy)")
    gate_up, down = (_scale_grad(p.to_local(), 1.0 / ep.world).to(dtype) for p in params)
    if ep.replicas == 1:
        return gate_up, down
    return _GatherReplicas.apply(gate_up, down, ep.replicas, ep.replica_group)


class _GatherReplicas(torch.autograd.Function):
    """The replica group's shards of two expert tensors concatenated on dim 0 (all-gather); backward:
    each rank's rows of the summed gradients (reduce-scatter). Both tensors in one collective each way."""

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor, down: torch.Tensor, replicas: int, group: Any) -> tuple[torch.Tensor, ...]:
        ctx.shapes, ctx.group = (gate_up.shape, down.shape), group
        flat = torch.cat([gate_up.reshape(gate_up.shape[0], -1), down.reshape(down.shape[0], -1)], dim=1)
        out = flat.new_empty((replicas * flat.shape[0], flat.shape[1]))
        dist.all_gather_into_tensor(out, flat.contiguous(), group=group)
        split = gate_up[0].numel()
        return (out[:, :split].reshape(-1, *gate_up.shape[1:]).contiguous(),
                out[:, split:].reshape(-1, *down.shape[1:]).contiguous())

    @staticmethod
    def backward(ctx: Any, grad_gate_up: torch.Tensor, grad_down: torch.Tensor) -> tuple[Any, ...]:
        (gu_shape, d_shape), rows = ctx.shapes, ctx.shapes[0][0]
        full = torch.cat([grad_gate_up.reshape(grad_gate_up.shape[0], -1), grad_down.reshape(grad_down.shape[0], -1)],
                         dim=1)
        out = full.new_empty((rows, full.shape[1]))
        dist.reduce_scatter_tensor(out, full.contiguous(), group=ctx.group)
        split = gu_shape[1:].numel()
        return out[:, :split].reshape(gu_shape), out[:, split:].reshape(d_shape), None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `factor`."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def _scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    return _ScaleGrad.apply(x, factor) if x.requires_grad else x


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: Any) -> torch.Tensor:
    """Rows input_splits[j] of `x` go to rank j; the result is the rows received, in source-rank order.
    Autograd-aware (its backward is the inverse all-to-all); gloo and NCCL."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    out = all_to_all_single_autograd(x.contiguous(), output_splits, input_splits, group)
    return out.wait() if hasattr(out, "wait") else out


def dispatch_combine(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, experts: torch.nn.Module,
                     ep: ExpertParallel) -> torch.Tensor:
    """[T, H] tokens, their top-k experts [T, k] and router weights [T, k] -> the experts' weighted sum
    [T, H], each expert computed on the rank that holds it."""
    tokens, top_k = indices.shape
    per_rank = experts.num_experts // ep.size
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)  # token copies sorted by expert, so by destination rank
    counts = torch.bincount(flat, minlength=experts.num_experts)
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts, group=ep.group)  # [source rank, my local expert] counts
    counts, received = counts.view(ep.size, per_rank), received.view(ep.size, per_rank)
    send_splits, recv_splits = counts.sum(1).tolist(), received.sum(1).tolist()
    gate_up, down = local_experts(experts, ep, x.dtype)
    if gate_up.shape[0] != per_rank:  # FSDP2 sharded dim 0 otherwise than over the EP ranks
        raise RuntimeError(f"expert parallel: this rank holds {gate_up.shape[0]} experts, not {per_rank}")
    sent = x[order // top_k]
    if ep.replicas > 1:  # the replicas' reduce-scatter after the dispatch's backward all-to-all on every rank
        sent = _keep_in_graph(sent, gate_up[:1], down[:1])
    arrived = all_to_all(sent, recv_splits, send_splits, ep.group)
    # Arrived rows are by source rank, then local expert: group them by local expert for the experts.
    segment = torch.arange(ep.size * per_rank, device=x.device).repeat_interleave(received.reshape(-1))
    by_expert = torch.argsort(segment % per_rank, stable=True)
    computed = grouped_expert_mlp(arrived[by_expert], received.sum(0), gate_up, down)
    if not sum(recv_splits):  # no token for any of this rank's experts: see `_keep_in_graph`
        computed = _keep_in_graph(computed, arrived, gate_up, down)
    returned = all_to_all(computed[torch.argsort(by_expert)], send_splits, recv_splits, ep.group)
    per_copy = returned[torch.argsort(order)].view(tokens, top_k, -1)
    return (per_copy * weights.unsqueeze(-1).to(per_copy.dtype)).sum(1).to(x.dtype)


def _keep_in_graph(computed: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
    """`computed` tied to `inputs` by a zero term, so their backward waits for its. A rank whose experts get
    no token must still run the backward of both all-to-alls (the other ranks' backward waits for it) and
    give its expert shards a gradient (zeros: the clip's norm and the optimizer see the same tensors on every
    rank); with replicas, their reduce-scatter must come after the dispatch's backward all-to-all on every
    rank (gloo's collectives block: two ranks waiting in different groups would hang)."""
    return computed + sum(t.sum() for t in inputs) * 0
