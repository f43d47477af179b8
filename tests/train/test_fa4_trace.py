"""What a compiled layer hands FlashAttention-4: the packed batch's max length, untouched.

FA4 launches with the max length floored at MIN_LAUNCH_SEQLEN (one kernel variant for short packs). The
floor belongs inside the ops: in the traced graph, max(512, max_length_q) became guards on the length that
failed mid-run and recompiled the layers (train/kernels/fa4.py). The ops cannot run on a CPU, so this
traces the call with a backend that only keeps the graph; where the ops apply the floor is
tests/train/test_attention.py's test_fa4_is_launched_with_a_floored_max_length."""

from __future__ import annotations

import torch

from train.kernels import fa4


def traced_graphs(lengths: tuple[int, ...]) -> list[torch.fx.GraphModule]:
    graphs = []

    def keep(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return lambda *args: (torch.zeros(1),)

    def attend(q, cu, max_length):
        return fa4.fa4_varlen_attention(q, q, q, cu, cu, max_length, max_length, None)

    compiled = torch.compile(attend, backend=keep, dynamic=True, fullgraph=True)
    q, cu = torch.randn(64, 4, 16), torch.tensor([0, 30, 64], dtype=torch.int32)
    for max_length in lengths:
        compiled(q, cu, max_length)
    return graphs


def test_the_compiled_graph_passes_the_max_length_to_fa4_as_its_input_for_every_length():
    graphs = traced_graphs((34, fa4.MIN_LAUNCH_SEQLEN, 4000))
    assert len(graphs) == 1  # a length on either side of the floor reuses the one graph
    (call,) = [n for n in graphs[0].graph.nodes if n.target is torch.ops.sft.fa4_varlen_fwd.default]
    max_q, max_k = call.args[5], call.args[6]
    assert max_q is max_k and max_q.op == "placeholder"  # no max(), no arithmetic a guard could come from
