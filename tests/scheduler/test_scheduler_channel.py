"""Channels on a real embedded Ray: FIFO order, backpressure, keys, weighted batches, async use, across groups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import torch

from rlplace.scheduler import Channel, ChannelTimeout, Cluster, Worker, WorkerGroup
from tests.scheduler.helpers import on_devices


class Producer(Worker):
    def produce(self, channel_name: str, count: int, keys: int) -> None:
        """Find the channel by name and put `count` tensors, dealt round-robin over `keys` keys."""
        channel = Channel.connect(channel_name)
        for i in range(count):
            channel.put(torch.full((4,), float(i)), key=i % keys, timeout=30)


class Consumer(Worker):
    def consume(self, channel: Channel, count: int) -> list[float]:
        """Take `count` items from this rank's key of a channel handed over by the driver."""
        return [channel.get(key=self.rank, timeout=30)[0].item() for _ in range(count)]


class AsyncConsumer(Worker):
    async def consume(self, channel: Channel, count: int) -> list[float]:
        return [(await channel.get_async(key=self.rank, timeout=30))[0].item() for _ in range(count)]


@pytest.fixture(scope="module")
def groups(cluster: Cluster) -> Iterator[tuple[WorkerGroup, WorkerGroup, WorkerGroup]]:
    producer = Producer.create_group().launch(cluster, name="producer", placement_strategy=on_devices((0,)))
    consumer = Consumer.create_group().launch(cluster, name="consumer", placement_strategy=on_devices((0,), (1,)))
    async_consumer = AsyncConsumer.create_group().launch(cluster, name="async", placement_strategy=on_devices((1,)))
    yield producer, consumer, async_consumer


def test_items_come_out_in_fifo_order(cluster: Cluster) -> None:
    channel = Channel.create("fifo")
    for item in ["a", {"b": 1}, 3, None, torch.arange(3)]:
        channel.put(item)
    assert channel.qsize() == 5
    assert [channel.get(timeout=5) for _ in range(4)] == ["a", {"b": 1}, 3, None]
    assert torch.equal(channel.get(timeout=5), torch.arange(3))
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


def test_get_batch_collects_items_until_their_weight_reaches_the_target(cluster: Cluster) -> None:
    channel = Channel.create("weighted")
    for item, weight in [("a", 2), ("b", 1), ("c", 3)]:
        channel.put(item, weight=weight)
    assert channel.get_batch(3) == ["a", "b"]
    with pytest.raises(ChannelTimeout, match=r"get_batch\(5\) on channel 'weighted' timed out"):
        channel.get_batch(5, timeout=0.2)
    assert channel.qsize() == 1  # a batch that timed out takes nothing
    channel.put("d", weight=2)
    assert channel.get_batch(5) == ["c", "d"]


def test_async_put_and_get(cluster: Cluster) -> None:
    channel = Channel.create("async-driver", maxsize=1)

    async def roundtrip() -> list[str]:
        await channel.put_async("x", key="k")
        with pytest.raises(ChannelTimeout):
            await channel.put_async("y", key="k", timeout=0.1)
        first = await channel.get_async(key="k", timeout=5)
        await channel.put_async("z", key="k", weight=2)
        return [first, *await channel.get_batch_async(2, key="k", timeout=5)]

    assert asyncio.run(roundtrip()) == ["x", "z"]


def test_channels_are_found_by_name(cluster: Cluster) -> None:
    channel = Channel.create("named", maxsize=3)
    other = Channel.connect("named")
    other.put("hello")
    assert (other.maxsize, channel.get(timeout=5)) == (3, "hello")
    with pytest.raises(ValueError, match="a channel named 'named' already exists"):
        Channel.create("named")
    with pytest.raises(ValueError, match=r"no channel named 'missing' was created within 0\.2 s"):
        Channel.connect("missing", timeout=0.2)


def test_channel_connects_worker_groups_with_backpressure(groups: tuple[WorkerGroup, ...]) -> None:
    producer, consumer, _ = groups
    channel = Channel.create("rollouts", maxsize=1)  # the producer must wait for the consumers at every item
    consumed = consumer.consume(channel, 3)
    producer.produce("rollouts", 6, keys=2).wait(timeout=60)
    assert consumed.wait(timeout=60) == [[0.0, 2.0, 4.0], [1.0, 3.0, 5.0]]


def test_async_worker_methods_use_the_channel(groups: tuple[WorkerGroup, ...]) -> None:
    producer, _, async_consumer = groups
    channel = Channel.create("async-worker", maxsize=2)
    consumed = async_consumer.consume(channel, 4)
    producer.produce("async-worker", 4, keys=1).wait(timeout=60)
    assert consumed.wait(timeout=60) == [[0.0, 1.0, 2.0, 3.0]]
