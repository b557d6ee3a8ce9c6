"""Data-parallel training whose result does not depend on the number of ranks.

Each actor rank holds a shard of the step's batch. For the placement never to change results, the ranks train the
update one process would train on the whole batch: every epoch's permutation is drawn over the global batch (by a
generator seeded identically on every rank), a rank takes the samples of each global minibatch that lie in its shard,
and every mean (advantage normalisation, loss aggregation, reported stats) divides by the global minibatch's count,
reduced over the ranks. Each rank's loss is then its part of the global mean, times the number of ranks, so that the
gradient averaging that follows gives the gradient of the global mean. Only float summation order remains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Shard:
    """One rank's part of a batch split over `world_size` ranks."""

    index: Tensor
    """[B] the position in the global batch (0 <= i < size) of each of this rank's samples, in its local order."""
    size: int
    """Samples in the global batch."""
    world_size: int
    sum_over_ranks: Callable[[Tensor], None]
    """Replaces a tensor by its sum over the ranks, in place; every rank calls it in the same order."""
    rank: int
    """This rank's position among the `world_size`."""

    def split(self, minibatches: list[Tensor]) -> list[Tensor]:
        """This rank's part of each global minibatch (positions in the global batch), as local positions in the
        global minibatch's order; empty where none of its samples lies in this shard."""
        local_of = torch.full((self.size,), -1, dtype=torch.long)
        local_of[self.index] = torch.arange(self.index.numel())
        return [found[found >= 0] for found in (local_of[mb] for mb in minibatches)]


def most_over_ranks(
    counts: list[int], rank: int, world_size: int, sum_over_ranks: Callable[[Tensor], None]
) -> list[int]:
    """Each of `counts` (this rank's) replaced by the largest any rank has, in one collective call: every rank calls
    it at once, with as many counts (the passes ranks must run in step when passes are collective)."""
    table = torch.zeros(world_size, len(counts), dtype=torch.float64)
    table[rank] = torch.tensor([float(count) for count in counts], dtype=torch.float64)
    sum_over_ranks(table)
    return table.max(dim=0).values.round().long().tolist()


def global_minibatches(size: int, epochs: int, num_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """Every epoch's permutation of the global batch's `size` samples, cut into `num_minibatches` minibatches: the
    update's steps, the same on every rank."""
    orders = [torch.randperm(size, generator=generator) for _ in range(epochs)]
    return [mb for order in orders for mb in order.tensor_split(num_minibatches)]
