"""What every training strategy does for a data-parallel actor; `replica` and `fsdp` fill it in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from rlplace.core.registry import load
from rlplace.core.strategies import STRATEGIES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Strategy(ABC):
    """How one rank of `world_size` holds and updates its models.

    `average`, when there are several ranks, replaces a tensor by its mean over them in place (every rank calls it in
    the same order, e.g. `Worker.average_over_group`); strategies that reduce through torch.distributed themselves
    (fsdp) need the default process group instead.
    """

    collective_passes: ClassVar[bool]
    """Forward and backward passes are collective (FSDP gathers each unit's weights from every rank): every rank must
    run as many of them, so a rank with fewer rows than another runs zero-weighted passes to keep in step."""

    def __init__(
        self,
        world_size: int,
        device: torch.device,
        dtype: str = "fp32",
        average: Callable[[Tensor], None] | None = None,
    ) -> None:
        self.world_size = world_size
        self.device = device
        self.dtype = DTYPES[dtype]
        self.average = average

    @abstractmethod
    def wrap(self, model: nn.Module, trained: bool = True) -> nn.Module:
        """Prepare `model` (on this rank's device) under the strategy, for training or, not `trained`, for forward
        passes alone (a frozen copy whose weights are replaced from outside, e.g. `core.weights.receive_weights`);
        returns it."""

    @abstractmethod
    def reduce_grads(self, model: nn.Module) -> None:
        """Make `model`'s gradients the mean over the ranks, after the last backward pass of an optimizer step."""

    @abstractmethod
    def sync_grads(self, model: nn.Module, enabled: bool) -> None:
        """Whether the next backward pass reduces gradients over the ranks (False while accumulating micro-batches,
        for strategies that reduce during the backward pass)."""

    def clip_grad_norm(self, model: nn.Module, max_norm: float) -> Tensor:
        """Clip the gradients' total norm (over every rank's part) to `max_norm`; returns it before clipping."""
        norm = nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    @abstractmethod
    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """`model`'s whole state dict on the CPU, complete on rank 0 (other ranks may get nothing); every rank calls
        it, as gathering shards is collective."""


def build_strategy(
    name: str,
    world_size: int,
    device: torch.device,
    dtype: str = "fp32",
    average: Callable[[Tensor], None] | None = None,
) -> Strategy:
    """The strategy registered as `name` (`rlplace.core.strategies.STRATEGIES`)."""
    factory = load(STRATEGIES[name].factory, STRATEGIES.key)
    return factory(world_size, device, dtype, average)
