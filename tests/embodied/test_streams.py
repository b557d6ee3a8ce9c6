"""Who talks to whom during generation: pipeline streams, their rollout ranks, and the actor ranks' env columns."""

from __future__ import annotations

import pytest

from rlplace.embodied.streams import Stream, actor_pieces, actor_shard, all_streams, streams_of_rollout


def test_all_streams_are_env_rank_major() -> None:
    # 8 envs over 2 env ranks (4 each), 2 stages per rank: ranges of 2 envs, numbered rank by rank.
    assert all_streams(8, 2, 2) == [
        Stream(0, env_rank=0, stage=0, start=0, end=2),
        Stream(1, env_rank=0, stage=1, start=2, end=4),
        Stream(2, env_rank=1, stage=0, start=4, end=6),
        Stream(3, env_rank=1, stage=1, start=6, end=8),
    ]
    assert [s.key for s in all_streams(8, 2, 2)] == ["stream0", "stream1", "stream2", "stream3"]


def test_streams_cover_every_env_once() -> None:
    for total, env_ranks, stages in [(4, 1, 1), (12, 2, 3), (10, 1, 3), (32, 4, 2)]:
        streams = all_streams(total, env_ranks, stages)
        assert len(streams) == env_ranks * stages
        envs = [i for s in streams for i in range(s.start, s.end)]
        assert envs == list(range(total)), (total, env_ranks, stages)


def test_uneven_stages_take_the_remainder_first() -> None:
    # 5 envs of one rank into 2 stages: [0, 3) and [3, 5), as numpy.array_split would.
    assert [(s.start, s.end) for s in all_streams(5, 1, 2)] == [(0, 3), (3, 5)]


def test_more_stages_than_envs_is_refused() -> None:
    with pytest.raises(ValueError, match="into 3 stages"):
        all_streams(4, 2, 3)


def test_streams_are_dealt_round_robin_to_rollout_ranks() -> None:
    streams = all_streams(8, 2, 2)
    assert [s.index for s in streams_of_rollout(streams, 0, 2)] == [0, 2]
    assert [s.index for s in streams_of_rollout(streams, 1, 2)] == [1, 3]
    # With 2 stages and 2 rollout ranks, each env rank's two stages go to different rollout ranks, so one rollout
    # rank infers for stage 0 while the other answers stage 1.
    assert {s.stage for s in streams_of_rollout(streams, 0, 2)} == {0}
    assert streams_of_rollout(streams, 0, 1) == streams
    dealt = [s for rank in range(3) for s in streams_of_rollout(streams, rank, 3)]
    assert sorted(dealt, key=lambda s: s.index) == streams


def test_actor_shard() -> None:
    assert [actor_shard(8, rank, 2) for rank in range(2)] == [(0, 4), (4, 8)]
    assert [actor_shard(6, rank, 3) for rank in range(3)] == [(0, 2), (2, 4), (4, 6)]
    assert actor_shard(4, 0, 1) == (0, 4)


def test_actor_pieces_send_each_rank_only_its_columns() -> None:
    # 8 envs on 1 env rank in 3 stages: streams [0, 3), [3, 6), [6, 8); 2 actor ranks train on [0, 4) and [4, 8).
    streams = all_streams(8, 1, 3)
    assert [actor_pieces(s, 8, 2) for s in streams] == [[(0, 0, 3)], [(0, 0, 1), (1, 1, 3)], [(1, 0, 2)]]
    # Every env column goes to exactly one actor rank.
    for ranks in (1, 2, 4):
        columns = [s.start + i for s in streams for _, lo, hi in actor_pieces(s, 8, ranks) for i in range(lo, hi)]
        assert sorted(columns) == list(range(8))
