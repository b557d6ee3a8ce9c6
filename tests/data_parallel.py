"""Data-parallel ranks as threads of the test process, for checking that an update does not depend on the rank count:
sums and averages go through shared slots and are added in rank order, as the mailboxes add them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


class ThreadRanks:
    """`world_size` ranks; `run(fn)` calls fn(rank) on a thread per rank and returns their results in rank order."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    def sum(self, rank: int, tensor: torch.Tensor) -> None:
        """Replace `tensor` by its sum over the ranks, in place (every rank calls it in the same order)."""
        self.slots[rank] = tensor.clone()
        self.barrier.wait()
        total = self.slots[0].clone()
        for other in self.slots[1:]:
            total += other
        tensor.copy_(total)
        self.barrier.wait()  # nobody overwrites its slot before every rank has read them all

    def mean(self, rank: int, tensor: torch.Tensor) -> None:
        self.sum(rank, tensor)
        tensor.div_(self.world_size)

    def average_grads(self, rank: int, grads: list[torch.Tensor]) -> None:
        """The gradients' mean over the ranks, in place, through one flat buffer (as `core.gradients`)."""
        flat = torch.cat([g.flatten() for g in grads])
        self.mean(rank, flat)
        torch.nn.utils.vector_to_parameters(flat, grads)

    def run(self, fn: Callable[[int], T]) -> list[T]:
        results: list[T | None] = [None] * self.world_size
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                results[rank] = fn(rank)
            except BaseException as error:  # surfaced below: a thread's exception would otherwise vanish
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        return results
