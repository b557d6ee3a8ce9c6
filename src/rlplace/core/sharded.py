"""Whether a tensor is a shard of a distributed one (a DTensor, as FSDP2 makes them), without importing
`torch.distributed.tensor` where nothing is sharded: that import costs every worker process a good part of a second
at start-up, and a process that holds DTensors has imported it already; and the parts of whole tensors that such a
process holds."""

from __future__ import annotations

import sys

import torch


def is_sharded(tensor: torch.Tensor) -> bool:
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor; any other tensor as it is."""
    return tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole on every rank (collective); any other tensor as it is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]


def part_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of the whole tensor `full`, as the sharded tensor `like` (of `full`'s shape) holds it: for
    `Shard(d)` on a one-dimensional mesh, torch.chunk's part along d, empty where the chunks run out before this rank
    (FSDP2's layout); `full` itself for a tensor that is not sharded or is replicated."""
    if not is_sharded(like):
        return full
    (placement,) = like.placements  # type: ignore[attr-defined]
    if not placement.is_shard():
        return full
    mesh = like.device_mesh  # type: ignore[attr-defined]
    chunks = torch.chunk(full, mesh.size(), dim=placement.dim)
    rank = mesh.get_local_rank()
    return chunks[rank] if rank < len(chunks) else full.narrow(placement.dim, 0, 0)
