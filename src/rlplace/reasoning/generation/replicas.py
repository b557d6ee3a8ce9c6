"""Engine replicas: a rollout group whose engine is split over `rollout.tensor_parallel_size` ranks.

The group's ranks form world_size / size replicas of `size` consecutive ranks, each holding one engine between them.
A replica is the unit of work: its ranks make the same calls with the same requests (each builds and runs its part of
the engine, which computes together), so micro-batches and held-out problems are shared out over replicas, not
ranks, and only a replica's first rank hands on what it made.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Replica:
    """Where a rollout rank stands: replica `index` of `count`, at place `part` within it."""

    index: int
    count: int
    part: int

    @classmethod
    def of(cls, rank: int, world_size: int, size: int) -> Replica:
        """Rank `rank` of a group of `world_size` ranks split into replicas of `size`."""
        return cls(rank // size, world_size // size, rank % size)

    @property
    def hands_on(self) -> bool:
        """Whether this rank hands the replica's results on (its first rank; the others hold the same)."""
        return self.part == 0
