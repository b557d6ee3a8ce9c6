"""Whether a tensor is a shard of a distributed one (a DTensor, as FSDP2 makes them), without importing
`torch.distributed.tensor` where nothing is sharded: that import costs every worker process a good part of a second
at start-up, and a process that holds DTensors has imported it already."""

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
