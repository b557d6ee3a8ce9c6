"""Gradient averaging over data-parallel actor ranks, shared by both families' actors."""

from __future__ import annotations

import torch
import torch.distributed as dist


def average_grads(grads: list[torch.Tensor], world_size: int) -> None:
    """Average gradients over the ranks of the default process group in one all-reduce of a flattened buffer.

    One flat buffer instead of one call per tensor: an all-reduce has a fixed cost per call that a many-layer
    model would otherwise pay per parameter."""
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
