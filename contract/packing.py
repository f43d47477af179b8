"""Best-fit-decreasing packing of document lengths into micro-batches of at most `budget` tokens: the one
rule the training's packing plan (train/dataset/packing.py, which then shuffles the bins by seed and epoch)
and the plan's "does the data fill one optimizer step" check (launcher/resolve/datarules.py) share. Torch-free."""

from __future__ import annotations

import bisect
from collections.abc import Sequence


def pack_bins(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Example indices per micro-batch, unshuffled; an example longer than `budget` gets a bin of its own."""
    if budget < 1:
        raise ValueError(f"packing budget must be >= 1 token, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))  # longest first, ties by index
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (remaining capacity, bin id), sorted: smallest fitting gap first
    for index in order:
        size = min(lengths[index], budget)
        slot = bisect.bisect_left(free, (size, -1))
        if slot == len(free):  # no open bin has room: open a new one
            bins.append([index])
            bin_id, remaining = len(bins) - 1, budget - size
        else:
            remaining, bin_id = free.pop(slot)
            bins[bin_id].append(index)
            remaining -= size
        if remaining > 0:
            bisect.insort(free, (remaining, bin_id))
    return bins
