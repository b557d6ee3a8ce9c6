"""Worker processes that outlive their worker: a re-placed run's new groups start in the processes of its old ones.

Every rank runs inside a `Host`, a Ray actor that becomes one worker (`become`: the rank's set-up, then the worker's
own `__init__`) and runs its calls (`call`). Starting a process and importing torch and the model classes is most of
what launching a group costs, and almost all of what a switch of placement costs (`benchmarks/replace.py`), so at a
switch (`Cluster.replace`) the hosts retire their workers instead of exiting, and the new groups' ranks become
workers in them: a rank takes over a retired host of its first device, or else a spare one (that no rank of its own
device takes) of another device of its node, re-pinned to its own cores. The next run of the same process takes over
a finished run's hosts the same way (`parking.py`).

A host is kept only where that leaves nothing of the old worker behind. A retired worker is closed (`Worker.close`)
and gives back its torch.distributed process group (`Worker._leave`); a process that loaded vLLM is never reused (its
engine keeps process-wide state: its own distributed world, registered ops); nor is any on a node with GPUs, where a
process starts with its rank's CUDA variables (`WorkerGroupSpec.start`). A retired host that no new rank takes is
stopped.
"""

from __future__ import annotations

import functools
import gc
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
from ray.actor import ActorClass, ActorHandle

from rlplace.scheduler.reservation import Bundle

if TYPE_CHECKING:
    from rlplace.scheduler.worker import Worker

Device = tuple[int, int | None]
"""(node rank, local device) of the bundle a process is scheduled into; local device None: a process without
devices, in its node's reservation."""

ACTOR_NAME_TOKEN = ":actor_name:"
"""A line of a process's output that starts with it names the actor in the prefix of its log lines on the driver's
console (Ray's log monitor reads it: `ray._private.ray_constants.LOG_PREFIX_ACTOR_NAME`)."""

RETIRE_TIMEOUT_S = 30.0
"""How long retiring workers may take before their processes are stopped instead. Retiring itself is quick (a
process group given back, a garbage collection), but on a loaded machine Ray can take seconds to deliver the call,
and a host stopped for that costs the next groups a process start each: only a stuck worker should reach the bound."""


class Host:
    """One worker process, holding one worker at a time (`become`, `retire`)."""

    def __init__(self) -> None:
        self.worker: Worker | None = None

    def become(
        self, pickled_cls: bytes, env: dict[str, str] | None, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int]:
        """Set up this process as a rank (`env`: its environment; None when the process started with it), then build
        the worker of class `pickled_cls` (`pickle_worker_class`); returns the rank's (host, process id).

        Unpickling the class imports its module, and with it torch and the model libraries: hundreds of thousands of
        objects that live as long as the process (of an earlier worker nothing is left: `retire` collected it). The
        cyclic garbage collector is off while they import, as its collections would walk them again and again as
        they grow, and then they are frozen out of it (`gc.freeze`), so that neither the worker's own collections nor
        `retire`'s walk them either; reference counting still frees whatever is dropped."""
        gc.disable()
        try:
            worker_cls: type[Worker] = ray.cloudpickle.loads(pickled_cls)
        finally:
            gc.freeze()
            gc.enable()
        worker = worker_cls.__new__(worker_cls)
        worker._start_rank(env)
        self._take_name(worker)
        worker.__init__(*args, **kwargs)  # type: ignore[misc]
        self.worker = worker
        return worker._process()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one of the worker's methods."""
        return getattr(self.worker, method)(*args, **kwargs)

    def retire(self) -> bool:
        """Drop the worker and what it took of the process; returns whether the process may become another worker."""
        worker, self.worker = self.worker, None
        if worker is not None:
            worker._leave()
        del worker
        gc.collect()
        return "vllm" not in sys.modules

    def _take_name(self, worker: Worker) -> None:
        """Go by the worker's name where Ray shows the process: its log lines' prefix (`ACTOR_NAME_TOKEN`) and its
        title (`ps`, `top`) between calls, `ray::` and the class name of the actor, which Ray reads after each call.
        (During a call Ray shows the class the process started as: `IdleHosts.take` prefers a host of that name.)"""
        self.__class__ = named_host(type(worker).__name__)
        name = f"{ACTOR_NAME_TOKEN}{type(worker).__name__} {worker.group_name}/{worker.rank}"
        for stream in (sys.stdout, sys.stderr):
            print(name, file=stream, flush=True)


def pickle_worker_class(worker_cls: type[Worker]) -> bytes:
    """`worker_cls` as `Host.become` takes it: pickled here, so that the host, not Ray, unpickles it (imports its
    module) when it chooses."""
    return ray.cloudpickle.dumps(worker_cls)


@functools.cache
def named_host(name: str) -> type[Host]:
    """`Host` under a worker class's name, which Ray shows as the process's."""
    return type(name, (Host,), {"__module__": Host.__module__, "__qualname__": name})


@functools.cache
def host_actor(name: str) -> ActorClass:
    """The Ray actor class of hosts started for workers of class `name` (made once: Ray exports it once)."""
    return ray.remote(named_host(name))


@dataclass(frozen=True, eq=False)
class HostProcess:
    """A host as the driver sees it: its actor, the device whose bundle it runs in, the share of that bundle it holds
    (`reservation.process_share`), which it keeps from one worker to the next, and the name it started under."""

    actor: ActorHandle
    device: Device
    share: Bundle
    name: str


class IdleHosts:
    """Retired hosts kept for the groups that start next (after a switch, or in the next run), by the device whose
    bundle they hold their share of."""

    def __init__(self) -> None:
        self._idle: dict[Device, list[HostProcess]] = defaultdict(list)
        self._wanted: Counter[Device] = Counter()
        """The next groups' processes by first device (`trim`), less those they took: a device's idle hosts past it
        are spare, for ranks of its node's other devices (`take`)."""

    def __iter__(self) -> Iterator[HostProcess]:
        return (host for hosts in self._idle.values() for host in hosts)

    def keep(self, hosts: Sequence[HostProcess], wanted: Counter[Device] | None) -> None:
        """Retire the workers of `hosts` and keep those whose process can be reused, as many as `wanted` can take
        (`trim`; None: all of them); stop the others, and those that do not retire within `RETIRE_TIMEOUT_S`."""
        retiring = {host.actor.retire.remote(): host for host in hosts}
        ready = ray.wait(list(retiring), num_returns=len(retiring), timeout=RETIRE_TIMEOUT_S)[0] if retiring else []
        for ref in ready:
            try:
                reusable = ray.get(ref)
            except ray.exceptions.RayError:
                reusable = False
            if reusable:
                host = retiring.pop(ref)
                self._idle[host.device].append(host)
        stop(list(retiring.values()))
        if wanted is not None:
            self.trim(wanted)

    def trim(self, wanted: Counter[Device]) -> None:
        """Keep as many idle hosts on each node as the next groups start there (`wanted`, processes by first
        device), those of each device first, up to what it wants; stop the rest."""
        self._wanted = Counter(wanted)
        kept: dict[Device, list[HostProcess]] = defaultdict(list)
        surplus = []
        for node in {node for node, _ in self._idle}:
            devices = [device for device in self._idle if device[0] == node]
            spare = []
            for device in devices:
                kept[device] = self._idle[device][: wanted[device]]
                spare += self._idle[device][wanted[device] :]
            room = sum(count for (at, _), count in wanted.items() if at == node)
            room -= sum(len(kept[device]) for device in devices)
            for host in spare[:room]:
                kept[host.device].append(host)
            surplus += spare[room:]
        self._idle = kept
        stop(surplus)

    def take(self, device: Device, name: str) -> HostProcess | None:
        """An idle host for a rank whose first device is `device`, taken: one of that device if there is one, else a
        spare one of another device of its node (the rank pins the process to its own cores; the process keeps its
        share of the other device's bundle, which the run holds all the same); of those, one started for a worker of
        class `name` if there is one (Ray shows it under that name). None when there is none."""
        source = device if self._idle.get(device) else max(self._spares(device[0]), key=self._spare, default=None)
        if source is None:
            return None
        idle = self._idle[source]
        same = [host for host in idle if host.name == name]
        host = (same or idle)[0]
        idle.remove(host)
        self._wanted[device] -= 1
        return host

    def _spare(self, device: Device) -> int:
        return len(self._idle[device]) - self._wanted[device]

    def _spares(self, node: int) -> list[Device]:
        """The devices of `node` with idle hosts that their own next ranks leave over."""
        return [device for device in self._idle if device[0] == node and self._spare(device) > 0]

    def stop(self) -> None:
        """Stop every idle host."""
        stop(list(self))
        self._idle.clear()


def stop(hosts: Sequence[HostProcess], graceful_s: float = 0.0) -> None:
    """Let `hosts` finish their current call and exit, then kill those still alive after `graceful_s`."""
    exits = [host.actor.__ray_terminate__.remote() for host in hosts] if graceful_s > 0 else []
    if exits:
        ray.wait(exits, num_returns=len(exits), timeout=graceful_s)
    for host in hosts:
        ray.kill(host.actor, no_restart=True)
