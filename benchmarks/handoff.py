"""Hand-off latency: what one item costs to go from one process to another and back, by path.

Every row is a ping-pong between two processes, timed on the side that starts it: it puts an item, the other side
takes it and puts it back, and the first takes it again. One round trip is two hand-offs, which is what an env and
its rollout pay per pipeline stage and env step (observations one way, actions the other). Rows:

- `Channel, one node`: rlplace's channel between two Ray actors on one node (Unix socket, no Ray call per item);
- `Channel, two nodes`: the same between two nodes of a `ray.cluster_utils.Cluster` (TCP);
- `Ray actor queue`: `ray.util.queue.Queue`, a queue held by a Ray actor, which is what the channel was before
  (two actor calls per hand-off);
- `Pipe (floor)`: `multiprocessing.Pipe` between two plain processes, the floor any Python process pair pays.

A second table times what generation pays: a lockstep exchange in which each side computes `--work-us` between
taking an item and answering it (as an env steps its simulators and a rollout infers), the two processes pinned to
different cores. A waiting process sleeps, and waking it costs more than a ping-pong shows, where the other side
answers at once: the cost per hand-off beyond the work, for the channel (4 KB-sized observations one way, actions
back, unbounded as in generation), sleeping when a key is empty or polling first for up to 1 ms as generation's
channels do, and for a bare Unix socket pair that blocks, or spins instead of sleeping.

    .venv/bin/python benchmarks/handoff.py [--count 2000] [--work-us 200]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
from ray.cluster_utils import Cluster as RayTestCluster
from ray.util.queue import Queue
from results import write_section

from rlplace.scheduler import Channel
from rlplace.scheduler.session import remove_session
from rlplace.scheduler.worker import pin_process

SIZES = {"4 KB": 4 << 10, "1 MB": 1 << 20}
WARM_UP = 20


def summarise(seconds: list[float]) -> tuple[float, float]:
    """Median and 99th percentile in microseconds, warm-up excluded."""
    ordered = sorted(seconds[WARM_UP:])
    return statistics.median(ordered) * 1e6, ordered[int(0.99 * (len(ordered) - 1))] * 1e6


@ray.remote(num_cpus=0)
class Side:
    """One end of a ping-pong over a pair of `put(item)` / `get()` endpoints the caller builds."""

    def serve(self, ping: Any, pong: Any, count: int) -> None:
        for _ in range(count):
            pong.put(ping.get(timeout=60), timeout=60)

    def start(self, ping: Any, pong: Any, item: np.ndarray, count: int) -> list[float]:
        times = []
        for _ in range(count):
            start = time.perf_counter()
            ping.put(item, timeout=60)
            pong.get(timeout=60)
            times.append(time.perf_counter() - start)
        return times


def ping_pong(options: list[dict[str, Any]], make: Callable[[str], Any], item: np.ndarray, count: int) -> list[float]:
    """Round trips of `item` between two `Side` actors started with `options[0]` and `options[1]`."""
    first, second = (Side.options(**o).remote() for o in options)
    ping, pong = make("ping"), make("pong")
    served = second.serve.remote(ping, pong, count)
    times = ray.get(first.start.remote(ping, pong, item, count))
    ray.get(served)
    for side in (first, second):
        ray.kill(side)
    return times


def pipe_side(conn: Any, count: int) -> None:
    for _ in range(count):
        conn.send(conn.recv())


def pipe_ping_pong(item: np.ndarray, count: int) -> list[float]:
    mine, theirs = multiprocessing.Pipe()
    other = multiprocessing.get_context("spawn").Process(target=pipe_side, args=(theirs, count))
    other.start()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        mine.send(item)
        mine.recv()
        times.append(time.perf_counter() - start)
    other.join()
    return times


LOCKSTEP_SPIN_US = 1000
"""How long the polling lockstep row polls before sleeping (generation's channels do the same)."""


def busy(seconds: float) -> None:
    """Compute (spin) for `seconds`: a stand-in for a simulator step or an inference."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@ray.remote(num_cpus=0)
class LockstepSide:
    """One side of a lockstep exchange over two channels: take an item, compute, answer."""

    def __init__(self, core: int) -> None:
        pin_process((core,))

    def answer(self, inbox: Channel, outbox: Channel, item: Any, count: int, work_s: float) -> None:
        outbox.put(item, timeout=60)
        for _ in range(count):
            inbox.get(timeout=60)
            busy(work_s)
            outbox.put(item, timeout=60)

    def lead(self, inbox: Channel, outbox: Channel, item: Any, count: int, work_s: float) -> list[float]:
        """Seconds per exchange (two hand-offs and two units of work), as the leading side sees them."""
        times, start = [], time.perf_counter()
        for _ in range(count):
            inbox.get(timeout=60)
            busy(work_s)
            outbox.put(item, timeout=60)
            now = time.perf_counter()
            times.append(now - start)
            start = now
        inbox.get(timeout=60)
        return times


def channel_lockstep(count: int, work_s: float, spin_s: float) -> list[float]:
    """Per hand-off cost beyond the work: observations (a 4 KB-sized tuple) one way, actions back; each `get` polls
    up to `spin_s` before sleeping."""
    observations = (np.zeros((32, 28), np.float32), np.zeros(32, np.float32), np.zeros(32, np.float32))
    obs = Channel.create("obs", spin_s=spin_s)  # unbounded, as in generation: the lockstep bounds them
    actions = Channel.create("actions", spin_s=spin_s)
    env, rollout = LockstepSide.remote(0), LockstepSide.remote(1)
    answered = env.answer.remote(actions, obs, observations, count, work_s)
    times = ray.get(rollout.lead.remote(obs, actions, np.zeros(32, np.int64), count, work_s))
    ray.get(answered)
    for side in (env, rollout):
        ray.kill(side)
    return [(t - 2 * work_s) / 2 for t in times]


def socket_lockstep(count: int, work_s: float, spin: bool) -> list[float]:
    """The same over a bare Unix socket pair between two forked processes on cores 0 and 1; `spin` polls the socket
    instead of sleeping in `recv`."""

    def receive(sock: socket.socket) -> bytes:
        while spin:
            try:
                return sock.recv(64, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
        return sock.recv(64)

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        pin_process((1,))
        for _ in range(count):
            receive(theirs)
            busy(work_s)
            theirs.send(b"x")
        os._exit(0)
    affinity = os.sched_getaffinity(0)
    pin_process((0,))
    times = []
    try:
        for _ in range(count):
            start = time.perf_counter()
            mine.send(b"x")
            receive(mine)
            busy(work_s)
            times.append((time.perf_counter() - start - 2 * work_s) / 2)
    finally:
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, affinity)
    return times


def channel(maxsize: int) -> Callable[[str], Channel]:
    return lambda name: Channel.create(name, maxsize=maxsize)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="round trips per row (1 MB rows: a tenth)")
    parser.add_argument("--work-us", type=float, default=200.0, help="work per side between lockstep hand-offs")
    args = parser.parse_args()
    work_s = args.work_us * 1e-6
    rows: list[tuple[str, str, tuple[float, float]]] = []
    lockstep: list[tuple[str, tuple[float, float]]] = [
        ("Unix socket pair, blocking (floor)", summarise(socket_lockstep(args.count, work_s, spin=False))),
        ("Unix socket pair, spinning", summarise(socket_lockstep(args.count, work_s, spin=True))),
    ]
    # No dashboard (its processes would leave a /tmp/pymp-* folder), and the session folder removed at the end.
    head = {"num_cpus": 2, "resources": {"node0": 2}, "include_dashboard": False}
    nodes = RayTestCluster(initialize_head=True, head_node_args=head)
    session = nodes.head_node.get_session_dir_path()
    nodes.add_node(num_cpus=2, resources={"node1": 2})
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, logging_level="ERROR")
    try:
        one_node = [{"resources": {"node0": 1}}] * 2
        two_nodes = [{"resources": {"node0": 1}}, {"resources": {"node1": 1}}]
        paths: dict[str, Callable[[np.ndarray, int], list[float]]] = {
            "Channel, one node": lambda item, count: ping_pong(one_node, channel(2), item, count),
            "Channel, two nodes": lambda item, count: ping_pong(two_nodes, channel(2), item, count),
            "Ray actor queue": lambda item, count: ping_pong(one_node, lambda _: Queue(maxsize=2), item, count),
            "Pipe (floor)": pipe_ping_pong,
        }
        for size_name, nbytes in SIZES.items():
            count = args.count if nbytes < 1 << 20 else max(WARM_UP + 10, args.count // 10)
            for path, run in paths.items():
                rows.append((path, size_name, summarise(run(np.zeros(nbytes // 8), count))))
        lockstep[:0] = [
            ("Channel, one node, sleeping", summarise(channel_lockstep(args.count, work_s, 0.0))),
            (
                f"Channel, one node, polling up to {LOCKSTEP_SPIN_US} us",
                summarise(channel_lockstep(args.count, work_s, LOCKSTEP_SPIN_US * 1e-6)),
            ),
        ]
    finally:
        ray.shutdown()
        nodes.shutdown()
        remove_session(session)
    lines = [
        f"Round trip of one item between two processes ({args.count} round trips per 4 KB row)\n",
        "| path | item | median (us) | p99 (us) |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {path} | {size_name} | {median:,.0f} | {p99:,.0f} |" for path, size_name, (median, p99) in rows]
    lines += [
        f"\nLockstep exchange, {args.work_us:.0f} us of work per side between hand-offs, cores 0 and 1: cost per",
        "hand-off beyond the work\n",
        "| path | median (us) | p99 (us) |",
        "|---|---:|---:|",
    ]
    lines += [f"| {path} | {median:,.0f} | {p99:,.0f} |" for path, (median, p99) in lockstep]
    print("\n".join(lines))
    write_section("handoff.py", "\n".join(lines))


if __name__ == "__main__":
    main()
