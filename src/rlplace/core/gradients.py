"""Gradient averaging over data-parallel actor ranks, shared by both families' actors."""

from __future__ import annotations

from collections.abc import Callable

import torch


def average_grads(grads: list[torch.Tensor], average: Callable[[torch.Tensor], None]) -> None:
    """Average gradients over the ranks with one call of `average` (in place, e.g. `Worker.average_over_group`) on
    a flattened buffer.

    One flat buffer instead of one call per tensor: each call has a fixed cost that a many-layer model would
    otherwise pay per parameter."""
    flat = torch.cat([g.flatten() for g in grads])
    average(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
