"""Group-to-group tensor transfers over gloo on a real embedded Ray, next to each group's own process group.

A broadcast to a group of one rank is the point-to-point case: here `actor` has one rank and `rollout` two.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlplace.scheduler import Cluster, Worker, WorkerError, WorkerGroup
from tests.scheduler.helpers import on_devices


class Peer(Worker):
    """Sends and receives what the driver asks; `all_reduce` uses the group's own default process group."""

    def broadcast_all(self, payloads: list[Any], group: str) -> None:
        for payload in payloads:
            self.broadcast(payload, group)

    def recv_all(self, count: int, group: str, rank: int) -> list[Any]:
        return [self.recv(group, rank) for _ in range(count)]

    def all_reduce(self, value: float, ranks_per_group: int | None = None) -> float:
        """The sum over the ranks of this rank's process group of `value * (rank + 1)`, so that every rank contributes
        its own number."""
        if not dist.is_initialized():
            self.init_process_group(ranks_per_group=ranks_per_group)
        tensor = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(tensor)
        return tensor.item()


@pytest.fixture(scope="module")
def peers(cluster: Cluster) -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    actor = Peer.create_group().launch(cluster, name="actor", placement_strategy=on_devices((0,)))
    rollout = Peer.create_group().launch(cluster, name="rollout", placement_strategy=on_devices((0,), (1,)))
    yield actor, rollout
    actor.terminate()
    rollout.terminate()


def assert_same(received: Any, sent: Any) -> None:
    if isinstance(sent, torch.Tensor):
        assert isinstance(received, torch.Tensor)
        assert (received.dtype, received.shape) == (sent.dtype, sent.shape)
        assert torch.equal(received, sent)
    elif isinstance(sent, dict):
        assert received.keys() == sent.keys()
        for key in sent:
            assert_same(received[key], sent[key])
    elif isinstance(sent, list | tuple):
        assert type(received) is type(sent) and len(received) == len(sent)
        for r, s in zip(received, sent, strict=True):
            assert_same(r, s)
    else:
        assert received == sent


TENSORS = [
    torch.randn(3, 5),
    torch.randn(4, 6).t(),  # not contiguous
    torch.arange(10, dtype=torch.int64),
    torch.tensor(2.5, dtype=torch.bfloat16),  # 0-dim, 2-byte dtype
    torch.tensor([True, False, True]),
    torch.empty(0, 7),
    torch.randn(1 << 20),  # 4 MB
]


def test_tensors_between_groups(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    received = actor.recv_all(len(TENSORS), "rollout", 1)
    rollout.execute_on(1).broadcast_all(TENSORS, "actor").wait(timeout=60)
    for got, sent in zip(received.wait(timeout=60)[0], TENSORS, strict=True):
        assert_same(got, sent)


LARGER = [
    [torch.randn(3) for _ in range(1500)],  # a header longer than the first message
    {"large": torch.randn(5 << 20), "small": torch.arange(3)},  # 20 MiB: a message of its own beside the packed ones
    {"packed": torch.randn(64, 1024), "flags": torch.tensor([True, False]), "half": torch.randn(3, dtype=torch.half)},
]
"""Payloads that do not fit in one message (`collective.FIRST_MESSAGE_BYTES`): the header, the packed buffer or a
large tensor follows on its own."""


def test_payloads_larger_than_one_message(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    received = actor.recv_all(len(LARGER), "rollout", 0)  # on the sender's core: every message there costs a tick
    rollout.execute_on(0).broadcast_all(LARGER, "actor").wait(timeout=60)
    for got, sent in zip(received.wait(timeout=60)[0], LARGER, strict=True):
        assert_same(got, sent)


def test_dicts_with_plain_values(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    state = {
        "weights": {"w": torch.randn(8, 4), "b": torch.zeros(4)},
        "version": 7,
        "names": ["w", "b"],
        "pair": (torch.ones(2), "tag"),
    }
    sent = rollout.execute_on(0).broadcast_all([state], "actor")  # sender first, receiver joins later
    time.sleep(0.5)
    assert_same(actor.recv_all(1, "rollout", 0).wait(timeout=60)[0][0], state)
    sent.wait(timeout=60)


def test_broadcast_reaches_every_rank_of_the_other_group(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    weights = {"layer.weight": torch.randn(16, 16), "layer.bias": torch.randn(16), "version": 3}
    received = rollout.recv_all(1, "actor", 0)
    actor.broadcast_all([weights], "rollout").wait(timeout=60)
    for rank_received in received.wait(timeout=60):
        assert_same(rank_received[0], weights)


def test_transfers_go_both_ways_over_one_pair(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    received = rollout.recv_all(1, "actor", 0)
    actor.broadcast_all([torch.full((3,), 1.0)], "rollout").wait(timeout=60)
    received.wait(timeout=60)
    back = actor.recv_all(1, "rollout", 1)  # the pair (actor 0, rollout 1), now the other way
    rollout.execute_on(1).broadcast_all([torch.full((3,), 9.0)], "actor").wait(timeout=60)
    assert_same(back.wait(timeout=60)[0][0], torch.full((3,), 9.0))


def test_default_process_group_coexists_with_transfers(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, rollout = peers
    assert rollout.all_reduce(1.0).wait(timeout=60) == [3.0, 3.0]  # 1 * 1 + 1 * 2
    received = actor.recv_all(1, "rollout", 1)
    rollout.execute_on(1).broadcast_all([torch.ones(5)], "actor").wait(timeout=60)
    assert_same(received.wait(timeout=60)[0][0], torch.ones(5))


def test_ranks_split_into_process_groups_of_their_own(cluster: Cluster) -> None:
    """`init_process_group(ranks_per_group=2)` on 4 ranks: two default process groups of two consecutive ranks each
    (the replicas of a rollout engine split over two ranks), which reduce over their own ranks only."""
    group = Peer.create_group().launch(cluster, name="replicas", placement_strategy=on_devices((0,), (0,), (1,), (1,)))
    try:
        with pytest.raises(WorkerError, match="ranks_per_group = 3 must divide the group's 4 ranks"):
            group.execute_on(0).all_reduce(1.0, 3).wait(timeout=60)
        assert group.all_reduce(1.0, 2).wait(timeout=60) == [3.0, 3.0, 7.0, 7.0]  # 1 + 2 and 3 + 4
    finally:
        group.terminate()


def test_unknown_peer_group_or_rank_is_a_clear_error(peers: tuple[WorkerGroup, WorkerGroup]) -> None:
    actor, _ = peers
    with pytest.raises(WorkerError, match="no worker group named 'critic' has been launched"):
        actor.broadcast_all([torch.ones(1)], "critic").wait(timeout=60)
    with pytest.raises(WorkerError, match=r"group 'rollout' has ranks 0\.\.1, not 5"):
        actor.recv_all(1, "rollout", 5).wait(timeout=60)
