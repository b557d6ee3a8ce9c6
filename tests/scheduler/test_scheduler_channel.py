"""Channels on a real embedded Ray: FIFO order, backpressure, keys, no global name, direct hand-offs between worker
groups, and errors that name the peer."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import ray
import torch

from rlplace.placement.placement import Placement
from rlplace.scheduler import Channel, ChannelError, ChannelTimeout, Cluster, Worker, WorkerError, WorkerGroup, wait_all
from rlplace.scheduler.mailbox import mailbox
from tests.scheduler.helpers import on_devices


class Producer(Worker):
    def produce(self, channel: Channel, count: int, keys: int) -> None:
        """Put `count` tensors into a channel handed over by the driver, dealt round-robin over `keys` keys."""
        for i in range(count):
            channel.put(torch.full((4,), float(i)), key=i % keys, timeout=30)

    def put_one(self, channel: Channel, key: int, value: float) -> None:
        channel.put(value, key=key, timeout=30)

    def read_key(self, channel: Channel, key: int) -> None:
        """Become the reader of `key` (nothing comes)."""
        with pytest.raises(ChannelTimeout):
            channel.get(key=key, timeout=0.05)

    def put_arrays(self, channel: Channel, key: int, count: int, nbytes: int) -> None:
        """Put `count` arrays of `nbytes` each, the i-th filled with i."""
        for i in range(count):
            channel.put(np.full(nbytes, i, dtype=np.uint8), key=key, timeout=30)

    def put_then_die(self, channel: Channel, key: int) -> None:
        channel.put(1.0, key=key, timeout=30)
        os._exit(1)

    def die(self) -> None:
        os._exit(1)


class Consumer(Worker):
    def consume(self, channel: Channel, count: int) -> list[float]:
        """Take `count` items from this rank's key."""
        return [channel.get(key=self.rank, timeout=30)[0].item() for _ in range(count)]

    def take(self, channel: Channel, timeout: float) -> float | None:
        """An item of this rank's key, or None after `timeout`."""
        try:
            return channel.get(key=self.rank, timeout=timeout)
        except ChannelTimeout:
            return None

    def take_arrays(self, channel: Channel, count: int) -> list[tuple[int, int]]:
        """(first value, size) of `count` arrays of this rank's key."""
        return [(int(a[0]), a.size) for a in (channel.get(key=self.rank, timeout=30) for _ in range(count))]

    def take_and_tell_polling(self, channel: Channel) -> tuple[float, bool]:
        """An item of this rank's key, and whether a `get` on the key would now poll before sleeping."""
        item = channel.get(key=self.rank, timeout=30)
        box = mailbox()
        return item, box._may_spin(box.inbox(channel.queue(self.rank)).writers)

    def take_two(self, channel: Channel) -> list[float]:
        return [channel.get(key=self.rank, timeout=30) for _ in range(2)]

    def echo(self, inbox: Channel, outbox: Channel, count: int) -> None:
        """Answer each item of this rank's key of `inbox` with the same item on `outbox`: a ping-pong's far end."""
        for _ in range(count):
            outbox.put(inbox.get(key=self.rank, timeout=30), key=self.rank, timeout=30)


@pytest.fixture(scope="module")
def groups(cluster: Cluster) -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    producer = Producer.create_group().launch(cluster, name="producer", placement_strategy=on_devices((0,)))
    consumer = Consumer.create_group().launch(cluster, name="consumer", placement_strategy=on_devices((0,), (1,)))
    yield producer, consumer
    producer.terminate()
    consumer.terminate()


def test_items_come_out_in_fifo_order(cluster: Cluster) -> None:
    channel = Channel.create("fifo")
    opaque = on_devices((1,))[0]  # any picklable object travels
    items = ["a", {"b": 1}, 3, None, np.arange(3), torch.arange(3), torch.arange(300_000), opaque]
    for item in items:
        channel.put(item)  # nobody reads the key yet: the registry holds them
    assert channel.qsize() == len(items)
    assert [channel.get(timeout=5) for _ in range(4)] == ["a", {"b": 1}, 3, None]
    channel.put("after")  # this process reads the key now: straight into its own inbox
    assert np.array_equal(channel.get(timeout=5), np.arange(3))
    assert torch.equal(channel.get(timeout=5), torch.arange(3))
    assert torch.equal(channel.get(timeout=5), torch.arange(300_000))
    got = channel.get(timeout=5)
    assert isinstance(got, Placement) and got == opaque
    assert channel.get(timeout=5) == "after"
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
    with pytest.raises(ChannelTimeout, match=r"put on channel 'bounded' timed out after 0\.1 s"):
        channel.put(4, timeout=0.1)  # full again, now in this process's own inbox
    assert [channel.get(), channel.get()] == [2, 3]
    with pytest.raises(ChannelTimeout, match=r"get on channel 'bounded' key 'k' timed out after 0\.1 s"):
        channel.get(key="k", timeout=0.1)


def test_closing_a_channel_fails_the_writer_waiting_for_room(cluster: Cluster) -> None:
    channel = Channel.create("closing", maxsize=1)
    channel.put(1)  # nobody reads the key: its registry holds the item, and the key is full
    failed: list[ChannelError] = []

    def write() -> None:
        try:
            channel.put(2)  # no timeout: waits for room
        except ChannelError as error:
            failed.append(error)

    writer = threading.Thread(target=write)
    writer.start()
    time.sleep(0.2)
    channel.close()
    writer.join(timeout=10)
    assert not writer.is_alive()
    assert "channel 'closing' was closed while a writer waited for room" in str(failed[0])


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


def test_a_bounded_key_holds_the_writer_until_the_reader_takes(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    """Once the reader is known, items go process to process; the writer counts what the reader has not taken."""
    producer, consumer = groups
    channel = Channel.create("credit", maxsize=1)
    assert consumer.take(channel, 0.1).wait(timeout=30) == [None, None]  # rank r reads key r from now on
    producer.put_one(channel, 0, 1.0).wait(timeout=30)  # direct; the reader's socket holds it
    blocked = producer.put_one(channel, 0, 2.0)
    with pytest.raises(TimeoutError):
        blocked.wait(timeout=1.0)  # no credit until the reader takes the first item
    assert consumer.take(channel, 5.0).wait(timeout=30) == [1.0, None]
    blocked.wait(timeout=30)
    assert consumer.take(channel, 0.1).wait(timeout=30) == [2.0, None]


def test_a_writer_of_large_items_never_waits_for_a_busy_reader(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    """Far more than a socket's buffer, put while the reader is in no channel call (as when the actor trains while
    the rollout hands over a step's trajectories): each large item travels as a memory file, so the puts return."""
    producer, consumer = groups
    channel = Channel.create("bulk")
    assert consumer.take(channel, 0.1).wait(timeout=30) == [None, None]  # rank r reads key r from now on
    producer.put_arrays(channel, 0, 16, 1 << 20).wait(timeout=30)  # 16 MB; the reader reads nothing meanwhile
    assert consumer.execute_on(0).take_arrays(channel, 16).wait(timeout=30) == [[(i, 1 << 20) for i in range(16)]]


def test_a_reader_polls_only_for_writers_pinned_to_other_cores(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    """Polling holds the reader's core: it may, only when the reader and every writer of the key are pinned to cores
    they do not share. The producer shares device 0 (core 0) with consumer rank 0; rank 1 has device 1 (core 1)."""
    producer, consumer = groups
    channel = Channel.create("lockstep", spin_s=0.001)
    assert consumer.take(channel, 0.05).wait(timeout=30) == [None, None]  # an empty key still times out
    taken = consumer.take_and_tell_polling(channel)
    wait_all(producer.put_one(channel, 0, 1.0), producer.put_one(channel, 1, 2.0))
    assert taken.wait(timeout=30) == [(1.0, False), (2.0, True)]
    channel.put(3.0, key=1, timeout=30)  # the driver is pinned to no core: it may share rank 1's
    assert consumer.execute_on(1).take_and_tell_polling(channel).wait(timeout=30) == [(3.0, False)]


def test_ping_pong_between_two_workers_and_the_driver(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    _, consumer = groups
    ping, pong = Channel.create("ping", maxsize=1), Channel.create("pong", maxsize=1)
    echo = consumer.echo(ping, pong, 50)
    for i in range(100):
        ping.put(np.full(512, i), key=i % 2, timeout=30)
        assert pong.get(key=i % 2, timeout=30)[0] == i  # driver -> rank i % 2 -> driver
    echo.wait(timeout=30)


def test_a_key_has_one_reader(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    _, consumer = groups
    channel = Channel.create("single")
    with pytest.raises(ChannelTimeout):
        channel.get(key=0, timeout=0.05)  # the driver reads key 0 now
    with pytest.raises(Exception, match=r"channel 'single' key 0 is read by the driver \(pid \d+\); a key has one"):
        consumer.take(channel, 1.0).wait(timeout=30)


def test_a_dead_peer_is_named_by_the_waiting_reader_and_the_writer(cluster: Cluster) -> None:
    doomed = Producer.create_group().launch(cluster, name="doomed", placement_strategy=on_devices((0,)))
    channel = Channel.create("orphan")
    with pytest.raises(ChannelTimeout):
        channel.get(key=0, timeout=0.05)  # the driver reads key 0, the worker key 1
    doomed.read_key(channel, 1).wait(timeout=30)
    doomed.put_one(channel, 0, 1.0).wait(timeout=30)
    assert channel.get(key=0, timeout=5) == 1.0
    with pytest.raises(WorkerError):
        doomed.die().wait(timeout=30)
    start = time.monotonic()
    with pytest.raises(ChannelError, match=r"channel 'orphan' key 0: its writer, doomed rank 0 \(pid \d+\), is gone"):
        channel.get(key=0, timeout=30)
    with pytest.raises(ChannelError, match=r"channel 'orphan' key 1: its reader, doomed rank 0 \(pid \d+\), is gone"):
        channel.put("too late", key=1, timeout=30)
    assert time.monotonic() - start < 5


def test_the_dead_peer_is_named_rather_than_the_channel_error_it_causes(cluster: Cluster) -> None:
    """The reader fails at once ("its writer is gone"); the driver names the root cause, the writer's death."""
    reader = Consumer.create_group().launch(cluster, name="reader", placement_strategy=on_devices((0,)))
    writer = Producer.create_group().launch(cluster, name="writer", placement_strategy=on_devices((1,)))
    channel = Channel.create("cause")
    with pytest.raises(WorkerError, match=r"group 'writer' rank 0: put_then_die\(\) failed: the worker process died"):
        wait_all(reader.take_two(channel), writer.put_then_die(channel, 0))
    reader.terminate()
