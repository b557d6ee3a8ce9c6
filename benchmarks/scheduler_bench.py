"""Scheduler micro-benchmarks: what a driver call and a group-to-group tensor cost (channel items: handoff.py).

Each figure stands next to a baseline that bounds it (raw `ray.put`/`ray.get`, a local memcpy), so the table shows
the scheduler's overhead rather than the machine's speed. Runs an embedded Ray with 4 logical cpu devices (on a
2-core machine devices 0 and 2 share a core, as they do in the placement sweeps on `cluster=local4`); on a machine
with NVIDIA GPUs it adds CUDA IPC (two processes on one GPU) and NCCL (two GPUs) rows. The weight-sync rows send a
small policy's weights (`core.weights`, as the embodied actor does every step) between ranks on two cores and on one.

    .venv/bin/python benchmarks/scheduler_bench.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from results import write_section

from rlplace.core.config import ClusterConfig
from rlplace.core.weights import broadcast_weights, receive_weights
from rlplace.placement.placement import Placement
from rlplace.scheduler import Cluster, Worker

MB = 1 << 20


class Bench(Worker):
    def noop(self) -> None:
        """Nothing: the call round trip alone."""

    def send_repeatedly(self, nbytes: int, count: int, group: str, device: str) -> float:
        """Send `count` tensors of `nbytes` to `group` (of one rank) after one warm-up transfer; seconds taken by the
        `count`."""
        tensor = torch.ones(nbytes // 4, device=device)
        self.broadcast(tensor, group)
        start = time.perf_counter()
        for _ in range(count):
            self.broadcast(tensor, group)
        return time.perf_counter() - start

    def recv_repeatedly(self, count: int, group: str) -> None:
        for _ in range(count + 1):
            self.recv(group, 0)

    def sync_repeatedly(self, count: int, group: str) -> float:
        """Send `count` weight syncs of `policy()` to `group` after one warm-up; seconds taken by the `count`."""
        model = policy()
        broadcast_weights(self, model, 0, group, bucket_mb=64)
        start = time.perf_counter()
        for version in range(count):
            broadcast_weights(self, model, version, group, bucket_mb=64)
        return time.perf_counter() - start

    def receive_syncs(self, count: int, group: str) -> None:
        model = policy()
        for _ in range(count + 1):
            receive_weights(self, model, group)


def policy() -> torch.nn.Module:
    """The embodied default's networks: actor and critic MLPs of 64 x 64 on CartPole (12 tensors, 37 KB)."""

    def mlp(outputs: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, outputs))

    return torch.nn.ModuleDict({"actor": mlp(2), "critic": mlp(1)})


def ranks(local_devices: list[int]) -> list[Placement]:
    """One rank per entry, all on node 0; entry i is rank i's local device."""
    n = len(local_devices)
    return [
        Placement(rank=i, world_size=n, node_rank=0, devices=(d,), local_devices=(d,), local_rank=i, local_world_size=n)
        for i, d in enumerate(local_devices)
    ]


def timed(function: Callable[[], object], repeat: int) -> float:
    """Seconds per call, after one warm-up call."""
    function()
    start = time.perf_counter()
    for _ in range(repeat):
        function()
    return (time.perf_counter() - start) / repeat


Row = tuple[str, str, str, str, str, str]


def round_trips(cluster: Cluster) -> list[Row]:
    rows = []
    for devices, repeat in (([0], 300), ([0, 1] * 4, 100)):
        group = Bench.create_group().launch(cluster, name=f"echo{len(devices)}", placement_strategy=ranks(devices))
        seconds = timed(lambda group=group: group.noop().wait(), repeat)
        rate = f"{1 / seconds:,.0f} calls/s"
        rows.append(("driver -> group call", f"{len(devices)} rank(s)", rate, f"{seconds * 1e6:,.0f} us/call", "", ""))
        group.terminate()
    return rows


def transfers(cluster: Cluster, device: str, sender_device: int, receiver_device: int, label: str) -> list[Row]:
    """One rank broadcasts tensors to another group of one rank; baseline: cloning the tensor in the driver."""
    sender = Bench.create_group().launch(cluster, name=f"tx-{label}", placement_strategy=ranks([sender_device]))
    receiver = Bench.create_group().launch(cluster, name=f"rx-{label}", placement_strategy=ranks([receiver_device]))
    rows = []
    for nbytes, count in ((MB, 50), (64 * MB, 5)):
        received = receiver.recv_repeatedly(count, sender.name)
        seconds = sender.send_repeatedly(nbytes, count, receiver.name, device).wait()[0] / count
        received.wait()
        tensor = torch.ones(nbytes // 4, device=device)
        baseline = timed(tensor.clone, 4 * count)
        rate = f"{1 / seconds:,.0f} transfers/s"
        payload = f"{nbytes // MB} MB tensor"
        case = f"broadcast to 1 rank ({label})"
        rows.append((case, payload, rate, gbps(nbytes, seconds), "torch clone", gbps(nbytes, baseline)))
    sender.terminate()
    receiver.terminate()
    return rows


def weight_syncs(cluster: Cluster, sender_device: int, receiver_device: int, label: str) -> list[Row]:
    """A small policy's weights from one rank to another group of one rank, as a step's weight sync sends them."""
    pair = f"{sender_device}-{receiver_device}"
    sender = Bench.create_group().launch(cluster, name=f"sync-tx-{pair}", placement_strategy=ranks([sender_device]))
    receiver = Bench.create_group().launch(cluster, name=f"sync-rx-{pair}", placement_strategy=ranks([receiver_device]))
    count = 100
    received = receiver.receive_syncs(count, sender.name)
    seconds = sender.sync_repeatedly(count, receiver.name).wait()[0] / count
    received.wait()
    state = policy().state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    sender.terminate()
    receiver.terminate()
    case, payload = f"weight sync to 1 rank ({label})", f"{nbytes / 1e3:.0f} KB, {len(state)} tensors"
    return [(case, payload, f"{1 / seconds:,.0f} syncs/s", f"{seconds * 1e3:.2f} ms", "", "")]


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if nbytes else ""


def print_table(rows: list[Row]) -> str:
    header = ("case", "payload", "rate", "throughput", "baseline", "baseline throughput")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]]
    lines.insert(1, " | ".join("-" * w for w in widths))
    print("\n".join(lines))
    return "\n".join(f"| {line.rstrip()} |" for line in lines)


def main() -> None:
    start = time.perf_counter()
    rows: list[Row] = []
    with Cluster(ClusterConfig(num_devices_per_node=4, max_oversubscription=8)) as cluster:
        rows += round_trips(cluster)
        rows += transfers(cluster, "cpu", 0, 1, "gloo")
        rows += weight_syncs(cluster, 0, 1, "gloo, two cores")
        rows += weight_syncs(cluster, 0, 2, "gloo, one core")
    notes = []
    if torch.cuda.is_available():
        gpus = torch.cuda.device_count()
        with Cluster(ClusterConfig(device_type="gpu", num_devices_per_node=gpus)) as cluster:
            rows += transfers(cluster, "cuda", 0, 0, "CUDA IPC, one GPU")
            if gpus >= 2:
                rows += transfers(cluster, "cuda", 0, 1, "NCCL, two GPUs")
            else:
                notes.append("NCCL row skipped: needs two GPUs")
    else:
        notes.append("CUDA IPC and NCCL rows skipped: no GPU on this machine")
    table = print_table(rows)
    for note in notes:
        print(f"note: {note}")
    write_section("scheduler_bench.py", "\n\n".join([table, *(f"note: {note}" for note in notes)]))
    print(f"({time.perf_counter() - start:.0f} s, {torch.get_num_threads()} torch threads in the driver)")


if __name__ == "__main__":
    main()
