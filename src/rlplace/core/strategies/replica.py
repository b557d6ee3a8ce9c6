"""`actor.strategy = ddp`: a full replica of every model on each rank, gradients averaged over the ranks by hand."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor, nn

from rlplace.core.gradients import average_grads
from rlplace.core.strategies.base import Strategy


class Replica(Strategy):
    """Each rank trains its own full copy; the averaged gradients keep the copies identical."""

    collective_passes: ClassVar[bool] = False

    def wrap(self, model: nn.Module, trained: bool = True) -> nn.Module:
        return model

    def reduce_grads(self, model: nn.Module) -> None:
        if self.world_size > 1:
            assert self.average is not None, "several ranks need a way to average"
            average_grads([p.grad for p in model.parameters() if p.grad is not None], self.average)

    def sync_grads(self, model: nn.Module, enabled: bool) -> None:
        """Nothing to switch: gradients are averaged once, after the step's last pass (`reduce_grads`)."""

    def full_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
