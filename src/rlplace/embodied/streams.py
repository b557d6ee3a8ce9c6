"""Who talks to whom during generation: pipeline streams, their keys in the channels, and actor shards.

Each env worker splits its sub-envs into `pipeline_stage_num` stages; each stage is a *stream* with its own key in
the two queues between env and rollout (observations one way, actions the other). Streams are dealt round-robin to
rollout ranks, so with two stages a rollout rank infers stage s while its env worker simulates stage s+1. A stream's
trajectory goes in pieces to the actor ranks whose data-parallel shard it overlaps, and only to them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplace.embodied.envs import split_stages


@dataclass(frozen=True)
class Stream:
    index: int
    env_rank: int
    stage: int
    start: int
    """First global env index of the stream."""
    end: int

    @property
    def key(self) -> str:
        return f"stream{self.index}"


def all_streams(total_num_envs: int, env_world_size: int, num_stages: int) -> list[Stream]:
    """Every stream, env-rank major; env rank r holds global envs [r * n, (r + 1) * n), n = total / env ranks."""
    per_rank = total_num_envs // env_world_size
    streams = []
    for env_rank in range(env_world_size):
        for stage, (start, end) in enumerate(split_stages(env_rank * per_rank, (env_rank + 1) * per_rank, num_stages)):
            streams.append(Stream(len(streams), env_rank, stage, start, end))
    return streams


def streams_of_rollout(streams: list[Stream], rollout_rank: int, rollout_world_size: int) -> list[Stream]:
    return [s for s in streams if s.index % rollout_world_size == rollout_rank]


def actor_shard(total_num_envs: int, actor_rank: int, actor_world_size: int) -> tuple[int, int]:
    """The env columns [start, end) an actor rank trains on."""
    per_rank = total_num_envs // actor_world_size
    return actor_rank * per_rank, (actor_rank + 1) * per_rank


def actor_pieces(stream: Stream, total_num_envs: int, actor_world_size: int) -> list[tuple[int, int, int]]:
    """The pieces of a stream's trajectory, one per actor rank whose shard overlaps the stream: (actor rank, first,
    end) positions within the stream."""
    pieces = []
    for rank in range(actor_world_size):
        low, high = actor_shard(total_num_envs, rank, actor_world_size)
        start, end = max(low, stream.start), min(high, stream.end)
        if start < end:
            pieces.append((rank, start - stream.start, end - stream.start))
    return pieces
