"""Averaging a tensor over the ranks of one worker group: the data-parallel update's gradients, once per minibatch.

gloo's all-reduce costs more per call between two processes on a small machine than a small model's whole backward pass
(benchmarks/actor_update.py), and a PPO update calls it once per minibatch. So a small CPU tensor goes through the
mailboxes instead: each rank sends it to every other rank (one socket hop, tens of microseconds) and adds all of them up
in rank order, which gives every rank the same bits. That moves (ranks - 1) copies per rank where a ring all-reduce
moves about two, so a tensor above `SMALL_BYTES`, or on a GPU, takes the group's torch.distributed all-reduce (gloo or
NCCL) instead.
"""

from __future__ import annotations

import time

import ray
import torch
import torch.distributed as dist

from rlplace.scheduler.context import WorkerContext
from rlplace.scheduler.hub import Hosted
from rlplace.scheduler.limits import SMALL_BYTES
from rlplace.scheduler.mailbox import Address, mailbox

TIMEOUT_S = 300.0
"""How long a rank waits for its peers' tensors (and, at first, for their addresses)."""


class GroupMean:
    """One rank's end of the group's averaging; peers are found through the cluster's rendezvous on first use."""

    def __init__(self, context: WorkerContext) -> None:
        self.context = context
        self.rank, self.world_size = context.placement.rank, context.placement.world_size
        self.tag = f"mean:{context.group_uid}"
        self._peers: list[Address] | None = None

    def __call__(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` by its mean over the ranks, in place; every rank must call it, in the same order."""
        if tensor.is_cuda or tensor.numel() * tensor.element_size() > SMALL_BYTES:
            dist.all_reduce(tensor)
            tensor /= self.world_size
            return
        box, peers, where = mailbox(), self.peers(), f"mean over group {self.context.group_name!r}"
        with box.lock:
            for rank, address in enumerate(peers):
                if rank != self.rank:
                    box.send(address, (self.tag, self.rank), tensor, 0, None, where)
            deadline = time.monotonic() + TIMEOUT_S
            total = torch.zeros_like(tensor)
            for rank in range(self.world_size):  # rank order, so that every rank adds up the same way
                if rank == self.rank:
                    total += tensor
                    continue
                received, part = box.receive((self.tag, rank), 0, deadline, f"{where} from rank {rank}")
                if not received:
                    raise TimeoutError(f"{where}: rank {rank} sent nothing within {TIMEOUT_S:g} s")
                total += part
        torch.div(total, self.world_size, out=tensor)

    def peers(self) -> list[Address]:
        """Every rank's mailbox address, this one's published first."""
        if self._peers is None:
            rendezvous = Hosted(self.context.rendezvous)
            key = f"{self.tag}:{{}}"
            ray.get(rendezvous.publish.remote(key.format(self.rank), mailbox().address))
            found = ray.get([rendezvous.lookup.remote(key.format(r), TIMEOUT_S) for r in range(self.world_size)])
            missing = [rank for rank, address in enumerate(found) if address is None]
            if missing:
                raise TimeoutError(f"group {self.context.group_name!r}: ranks {missing} did not show up")
            self._peers = found
        return self._peers
