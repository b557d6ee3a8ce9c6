"""Hand-off latency: what one item costs to go from one process to another and back, by path.

Every row is a ping-pong between two processes, timed on the side that starts it: it puts an item, the other side
takes it and puts it back, and the first takes it again. One round trip is two hand-offs, which is what an env and
its rollout pay per pipeline stage and env step (observations one way, actions the other). Rows:

- `Channel, one node`: rlplace's channel between two Ray actors on one node (Unix socket, no Ray call per item);
- `Channel, two nodes`: the same between two nodes of a `ray.cluster_utils.Cluster` (TCP);
- `Ray actor queue`: `ray.util.queue.Queue`, a queue held by a Ray actor, which is what the channel was before
  (two actor calls per hand-off);
- `Pipe (floor)`: `multiprocessing.Pipe` between two plain processes, the floor any Python process pair pays.

    .venv/bin/python benchmarks/handoff.py [--count 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
from ray.cluster_utils import Cluster as RayTestCluster
from ray.util.queue import Queue

from rlplace.scheduler import Channel

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


def channel(maxsize: int) -> Callable[[str], Channel]:
    return lambda name: Channel.create(name, maxsize=maxsize)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2000, help="round trips per row (1 MB rows: a tenth)")
    args = parser.parse_args()
    rows: list[tuple[str, str, tuple[float, float]]] = []
    nodes = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node0": 2}})
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
    finally:
        ray.shutdown()
        nodes.shutdown()
    print(f"Round trip of one item between two processes ({args.count} round trips per 4 KB row)\n")
    print("| path | item | median (us) | p99 (us) |")
    print("|---|---|---:|---:|")
    for path, size_name, (median, p99) in rows:
        print(f"| {path} | {size_name} | {median:,.0f} | {p99:,.0f} |")


if __name__ == "__main__":
    main()
