"""The hub: one small Ray actor per process and Ray connection, holding the coordination objects that process creates.

A channel's registry and a cluster's rendezvous are a few dictionaries each that answer a handful of calls per run.
As Ray actors of their own they cost a Python process each, started and torn down with every channel of every run;
hosted together in one async actor, a run starts one such process however many channels it opens. Each object lives
under an address (`<hub>/<key>`) that pickles as a string, so workers find it by name, and a `Hosted` handle calls
it like an actor: `hosted.put.remote(key, item)` returns an ObjectRef. Hosted objects' methods are coroutines, all on
the hub's one event loop, so an object waiting for something never blocks another's calls.

The hub is created by the first `host` of a process, on that process's node, and is owned by it: it ends with the
process or with its connection to Ray (a process that connects again gets a new hub).
"""

from __future__ import annotations

import uuid
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
class _Hub:
    """Hosts objects by key and forwards calls to their (async) methods."""

    def __init__(self) -> None:
        self._objects: dict[str, Any] = {}

    async def create(self, key: str, cls: type, args: tuple[Any, ...]) -> None:
        self._objects[key] = cls(*args)

    async def call(self, key: str, method: str, args: tuple[Any, ...]) -> Any:
        hosted = self._objects.get(key)
        if hosted is None:
            raise LookupError(f"{key!r} was closed, or never hosted here")
        return await getattr(hosted, method)(*args)

    async def drop(self, key: str) -> None:
        """Forget `key`'s object, after letting it wake whatever waits on it (its `close`, if it has one)."""
        hosted = self._objects.pop(key, None)
        if hasattr(hosted, "close"):
            await hosted.close()


_OWN: tuple[tuple[str, str], str] | None = None
"""This process's hub in its current Ray connection: ((node id, job id) of that connection, the hub's name). `_FOUND`
holds its handle, which keeps the hub alive: Ray ends an actor nobody holds a handle to, and one whose owner
disconnected."""
_FOUND: dict[str, ActorHandle] = {}
"""Hubs of other processes this one looked up, by name (hub names are unique, never reused)."""


class Hosted:
    """A handle on a hosted object, made from its address in any process of the Ray session:
    `hosted.method.remote(*args)` calls it and returns an ObjectRef."""

    def __init__(self, address: str) -> None:
        self.address = address
        hub, _, self._key = address.partition("/")
        self._hub = _hub_named(hub)

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self._hub, self._key, method)

    def close(self) -> None:
        """Drop the object from its hub (without waiting)."""
        self._hub.drop.remote(self._key)


class _Method:
    def __init__(self, hub: ActorHandle, key: str, method: str) -> None:
        self._hub, self._key, self._method = hub, key, method

    def remote(self, *args: Any) -> ray.ObjectRef:
        return self._hub.call.remote(self._key, self._method, args)


def host(cls: type, *args: Any) -> Hosted:
    """Create `cls(*args)` in this process's hub (started on first use, on this process's node) and return its
    handle. `cls` must be importable where the hub runs and define its methods with `async def`."""
    global _OWN
    context = ray.get_runtime_context()
    node_id = context.get_node_id()
    if _OWN is None or _OWN[0] != (node_id, context.get_job_id()):
        name = f"rlplace-hub-{uuid.uuid4().hex[:12]}"
        node = NodeAffinitySchedulingStrategy(node_id, soft=True)
        _FOUND[name] = _Hub.options(name=name, scheduling_strategy=node).remote()
        _OWN = ((node_id, context.get_job_id()), name)
    key = uuid.uuid4().hex[:12]
    # Waited for: another process may call the object as soon as it has the address.
    ray.get(_FOUND[_OWN[1]].create.remote(key, cls, args))
    return Hosted(f"{_OWN[1]}/{key}")


def _hub_named(name: str) -> ActorHandle:
    if name not in _FOUND:
        _FOUND[name] = ray.get_actor(name)
    return _FOUND[name]
