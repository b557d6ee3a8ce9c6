"""`Worker`: the base class of every component process (actor, rollout, env, ...).

A worker only exists as one rank of a group launched on a cluster: `MyWorker.create_group(cfg).launch(cluster,
name="actor", placement_strategy=...)`. Its process is set up before the subclass's `__init__` runs: it knows its
placement, sees only its devices, and on a cpu cluster runs on its devices' cores with as many torch threads, so
that placement has a real cost. Public methods of a subclass become fan-out calls on its `WorkerGroup`.

torch is imported on first use, not with this module: a worker that never touches it (a simulator) starts faster and
holds much less memory (compare `make run`'s env and rollout processes).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import ray

from rlplace.metrics.timeline import Span, make_span
from rlplace.placement.placement import Placement
from rlplace.scheduler.context import WorkerContext
from rlplace.scheduler.device_memory import DeviceMemory
from rlplace.scheduler.group import WorkerGroupSpec
from rlplace.scheduler.serving import serve_calls

if TYPE_CHECKING:
    import torch

    from rlplace.scheduler.channel import Channel
    from rlplace.scheduler.collective import Payload, Transfers
    from rlplace.scheduler.group_mean import GroupMean


class Worker:
    """One rank of a worker group; subclass it and add public methods.

    Inside a worker: `self.placement`, `self.rank`, `self.world_size`, `self.group_name`, `self.device`, the
    environment variables RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and
    CUDA_VISIBLE_DEVICES, and helpers for the data-parallel process group and for tensor transfers to other groups.
    """

    _context: WorkerContext
    _spans: list[tuple[str, float, float, tuple[int, int] | None]]
    """Timed blocks since the last `pop_timings`: name, unix start, seconds, (peak, resident) device bytes or None
    (made `Span`s when handed over)."""
    _device_memory: DeviceMemory

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        self = super().__new__(cls)
        if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
            raise RuntimeError(
                f"{cls.__name__} is a Worker and runs only as part of a worker group: use "
                f"{cls.__name__}.create_group(...).launch(cluster, name=..., placement_strategy=...) "
                f"instead of {cls.__name__}(...)"
            )
        return self

    def _start_rank(self, env: dict[str, str] | None) -> None:
        """Set up this process as its rank, before the worker's own `__init__` (`hosts.Host.become`): its environment
        (`env`; None when the process started with it), its context and its cores."""
        if env is not None:
            os.environ.update(env)
        context = WorkerContext.from_env()
        if context is None:
            raise RuntimeError(f"{type(self).__name__} started without its worker context")
        self._context = context
        self._spans = []
        self._device_memory = DeviceMemory()
        if context.cores:
            pin_process(context.cores)

    def close(self) -> None:
        """Release what this worker holds outside Python's reach (an engine's threads, a scratch folder) when its
        process retires it (the run ended and parked its processes, or was re-placed: `hosts.py`), where no exit
        handler would run: a process that is not reused is killed. Override it; the default holds nothing."""

    def _leave(self) -> None:
        """Give back what this rank holds of its process, which may become another worker next (a re-placed run's,
        `hosts.py`): what `close` releases, then torch.distributed's process groups."""
        self.close()
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroupSpec:
        """Describe a group of this worker class built with `cls(*args, **kwargs)` on every rank; then `.launch()`."""
        return WorkerGroupSpec(cls, args, kwargs)

    @property
    def placement(self) -> Placement:
        return self._context.placement

    @property
    def rank(self) -> int:
        return self._context.placement.rank

    @property
    def world_size(self) -> int:
        return self._context.placement.world_size

    @property
    def group_name(self) -> str:
        return self._context.group_name

    @property
    def device(self) -> torch.device:
        """The worker's first device: `cuda:0` (its first visible GPU) on a gpu cluster, else the CPU."""
        import torch

        if self._context.device_type == "gpu" and self._context.placement.local_devices:
            return torch.device("cuda", 0)
        return torch.device("cpu")

    def pop_timings(self) -> list[Span]:
        """Hand over and forget the spans of `@timer` methods and `span` blocks recorded since the last pop."""
        spans, self._spans = self._spans, []
        group, rank = self.group_name, self.rank
        return [make_span(name, group, rank, start, seconds, memory) for name, start, seconds, memory in spans]

    def _process(self) -> tuple[str, int]:
        """This rank's host and process id, which the driver reads once the rank has started: a call that misses its
        deadline is blamed on a rank whose process is stopped, rather than on one waiting for it."""
        return socket.gethostname(), os.getpid()

    def _serve(self, channel: Channel) -> None:
        """Run the calls the driver sends this rank through `channel`, answering on it, until told to stop: the one
        long Ray call of a served group (`rlplace.scheduler.serving`)."""
        serve_calls(self, channel)

    def init_process_group(self, timeout_s: float = 300.0, ranks_per_group: int | None = None) -> None:
        """Join this group's default torch.distributed process group (gloo on cpu, nccl on gpu), e.g. for DDP.

        With `ranks_per_group` = k, the ranks form world_size / k process groups of k consecutive ranks instead (a
        rollout engine sharded over each k by tensor parallelism): this rank joins its own as the default group, at
        its place within it. Every group rendezvouses through one store that rank 0 serves at MASTER_ADDR:MASTER_PORT,
        each under a prefix of its own, so the groups need no address beyond the one the launch gave the ranks.
        """
        import torch
        import torch.distributed as dist

        size = self.world_size if ranks_per_group is None else ranks_per_group
        if size < 1 or self.world_size % size:
            raise ValueError(f"ranks_per_group = {ranks_per_group} must divide the group's {self.world_size} ranks")
        backend = "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            backend = "nccl"
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size=self.world_size,
            is_master=self.rank == 0,
            timeout=timeout,
        )
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"ranks_{self.rank // size}", store),
            rank=self.rank % size,
            world_size=size,
            timeout=timeout,
        )

    def average_over_group(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` by its mean over this group's ranks, in place (data-parallel gradients); every rank calls
        it in the same order. Small CPU tensors go rank to rank, others through `init_process_group`'s group."""
        self._group_mean(tensor)

    def sum_over_group(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` by its sum over this group's ranks, in place (global counts and normalisers); every rank
        calls it in the same order."""
        self.average_over_group(tensor)
        tensor.mul_(self.world_size)

    @functools.cached_property
    def _group_mean(self) -> GroupMean:
        from rlplace.scheduler.group_mean import GroupMean

        return GroupMean(self._context)

    @functools.cached_property
    def _transfers(self) -> Transfers:
        from rlplace.scheduler.collective import Transfers

        return Transfers(self._context, self.device)

    def broadcast(self, payload: Payload, dst_group: str) -> None:
        """Send a tensor or a (nested) dict/list of tensors to every rank of `dst_group` (e.g. weight sync); each of
        them calls `recv`. A group of one rank makes it a point-to-point send."""
        self._transfers.broadcast(payload, dst_group)

    def recv(self, src_group: str, src_rank: int) -> Payload:
        """Receive what rank `src_rank` of `src_group` sends with `broadcast`."""
        return self._transfers.recv(src_group, src_rank)

    def span(self, name: str) -> _SpanTimer:
        """Time a block inside a method (`with self.span("env_step"):`), like `@timer` does a whole method (device
        memory included): for phases finer than one call (one simulator step, one inference), so the timeline shows
        when a component computes, not when it waits."""
        return _SpanTimer(self, name)

    def _record_span(self, name: str, start: float, seconds: float, memory: tuple[int, int] | None = None) -> None:
        """Keep a span that began at unix time `start`; its length comes from a monotonic clock, which the wall
        clock's adjustments cannot stretch or shrink. `memory`: the device bytes at peak and left at its end."""
        self._spans.append((name, start, seconds, memory))


class _SpanTimer:
    """`Worker.span`'s context manager: a plain class, cheaper than a generator-based one, which a hand-off between
    two spans pays on its way (benchmarks/handoff.py)."""

    __slots__ = ("name", "start", "tick", "worker")

    def __init__(self, worker: Worker, name: str) -> None:
        self.worker, self.name = worker, name

    def __enter__(self) -> None:
        self.worker._device_memory.enter()
        self.start, self.tick = time.time(), time.perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        seconds = time.perf_counter() - self.tick
        self.worker._record_span(self.name, self.start, seconds, self.worker._device_memory.exit())


def pin_process(cores: tuple[int, ...]) -> None:
    """Run every thread of this process, and the threads it starts later, on `cores`; size torch's pool to them.

    `os.sched_setaffinity(0, ...)` only moves the calling thread, while Ray's threads already run, so each thread
    of the process is moved; threads started later inherit the affinity of their creator. A torch imported later
    sizes its pool from OMP_NUM_THREADS, which the launch sets (`context.worker_env`), unless the OpenMP runtime was
    loaded before that, by LD_PRELOAD (vLLM's CPU platform preloads torch's libgomp for the processes it starts, or
    a user's shell preloads a runtime): it read the variable at process start, so torch is imported now and told.
    """
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
    torch = sys.modules.get("torch")
    if torch is None and _openmp_loaded():
        import torch
    if torch is not None:
        torch.set_num_threads(len(cores))


def _openmp_loaded() -> bool:
    """Whether an OpenMP runtime (GNU, Intel or LLVM) is mapped into this process."""
    with open("/proc/self/maps") as maps:
        return any(name in line for line in maps for name in ("libgomp", "libiomp5", "libomp."))
