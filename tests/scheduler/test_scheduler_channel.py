"""Channels on a real embedded Ray: FIFO order, backpressure, keys, no global name, handed to worker groups."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import ray
import torch

from rlplace.placement.placement import Placement
from rlplace.scheduler import Channel, ChannelTimeout, Cluster, Worker, WorkerGroup
from rlplace.scheduler.channel import INLINE_BYTES
from tests.scheduler.helpers import on_devices


class Producer(Worker):
    def produce(self, channel: Channel, count: int, keys: int) -> None:
        """Put `count` tensors into a channel handed over by the driver, dealt round-robin over `keys` keys."""
        for i in range(count):
            channel.put(torch.full((4,), float(i)), key=i % keys, timeout=30)


class Consumer(Worker):
    def consume(self, channel: Channel, count: int) -> list[float]:
        """Take `count` items from this rank's key."""
        return [channel.get(key=self.rank, timeout=30)[0].item() for _ in range(count)]


@pytest.fixture(scope="module")
def groups(cluster: Cluster) -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    producer = Producer.create_group().launch(cluster, name="producer", placement_strategy=on_devices((0,)))
    consumer = Consumer.create_group().launch(cluster, name="consumer", placement_strategy=on_devices((0,), (1,)))
    yield producer, consumer
    producer.terminate()
    consumer.terminate()


def test_items_come_out_in_fifo_order(cluster: Cluster) -> None:
    channel = Channel.create("fifo")
    large = torch.arange(INLINE_BYTES // 8 + 1)  # int64: one element over the inline size, so via the object store
    opaque = on_devices((1,))[0]  # neither array nor plain value: its size is unknown, so via the object store too
    items = ["a", {"b": 1}, 3, None, np.arange(3), torch.arange(3), large, opaque]
    for item in items:
        channel.put(item)
    assert channel.qsize() == len(items)
    assert [channel.get(timeout=5) for _ in range(4)] == ["a", {"b": 1}, 3, None]
    assert np.array_equal(channel.get(timeout=5), np.arange(3))
    assert torch.equal(channel.get(timeout=5), torch.arange(3))
    assert torch.equal(channel.get(timeout=5), large)
    got = channel.get(timeout=5)
    assert isinstance(got, Placement) and got == opaque
    assert channel.empty()


def test_full_channel_blocks_put_until_timeout(cluster: Cluster) -> None:
    channel = Channel.create("bounded", maxsize=2)
    channel.put(1)
    channel.put(2)
    assert channel.full()
    start = time.monotonic()
    with pytest.raises(ChannelTimeout, match=r"put on channel 'bounded' timed out after 0\.2 s"):
        channel.put(3, timeout=0.2)
    assert time.monotonic() - start >= 0.2
    assert channel.get() == 1
    channel.put(3, timeout=0.2)
    assert [channel.get(), channel.get()] == [2, 3]
    with pytest.raises(ChannelTimeout, match=r"get on channel 'bounded' key 'k' timed out after 0\.1 s"):
        channel.get(key="k", timeout=0.1)


def test_keys_are_independent_fifos_with_their_own_maxsize(cluster: Cluster) -> None:
    channel = Channel.create("keyed", maxsize=1)
    channel.put("to 0", key=0)
    channel.put("to 1", key=1)  # key 0 being full does not block key 1
    assert channel.full(key=0) and channel.full(key=1) and channel.empty(key=2)
    assert (channel.qsize(key=0), channel.qsize()) == (1, 0)
    assert channel.get(key=1) == "to 1"
    assert channel.get(key=0) == "to 0"


def test_a_name_only_labels_a_channel(cluster: Cluster) -> None:
    """Two runs in one Ray may use the same channel names: nothing is registered under them."""
    first, second = Channel.create("rollouts", maxsize=1), Channel.create("rollouts", maxsize=1)
    first.put("first")
    second.put("second", timeout=0.2)  # a queue of its own, not the full one of `first`
    assert (first.get(timeout=5), second.get(timeout=5)) == ("first", "second")
    assert not [name for name in ray.util.list_named_actors() if "rollouts" in name]
    assert repr(first) == "Channel(name='rollouts', maxsize=1)"
    with pytest.raises(ValueError, match="channel 'rollouts': maxsize must be >= 0, got -1"):
        Channel.create("rollouts", maxsize=-1)


def test_channel_connects_worker_groups_with_backpressure(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    producer, consumer = groups
    channel = Channel.create("rollouts", maxsize=1)  # the producer must wait for the consumers at every item
    consumed = consumer.consume(channel, 3)
    producer.produce(channel, 6, keys=2).wait(timeout=60)
    assert consumed.wait(timeout=60) == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]
