"""rlplace.scheduler: the only layer that talks to Ray.

`Cluster` holds the Ray cluster and its devices; `Worker` subclasses are launched as `WorkerGroup`s (several side by
side with `start` and `wait_started`) whose method calls fan out to every rank and return a `GroupFuture` (`wait_all`
waits on several at once); `Channel` queues data between groups; `Worker.broadcast` and `Worker.recv` move tensors
between groups; `@timer` records where the time went; `serve` sends a group's calls through the mailboxes instead of
Ray, for loops that call every few milliseconds.

    with Cluster(cfg.cluster) as cluster:
        actor = ActorWorker.create_group(cfg).launch(cluster, name="actor", placement_strategy=strategy)
        losses = actor.run_training().wait()  # one result per rank

The modules, by job (each imports only modules listed before it, or unrelated ones: no import cycle,
tests/scheduler/test_scheduler_imports.py):

- `errors`, `timer`, `limits`, `context`: the scheduler's exceptions, the `@timer` decorator, shared constants, and
  what a worker process must know before user code runs (carried in its environment).
- `session`: the Ray session's lifecycle: start an embedded local Ray, attach to a running one, stop it leaving no
  process or session folder behind. The one module that reaches into `ray._private`.
- `hub`: one small actor per process and Ray connection hosting the coordination objects it creates (channel
  registries, rendezvous), so a run starts one such process however many channels it opens.
- `reservation`, `rendezvous`: the run's devices held as Ray placement groups; the object through which workers find
  each other.
- `transport`: how a group's call reaches its ranks and comes back: the `CallTransport` interface, per-rank handles
  (`RankCall`) that settle with a result or a `WorkerError` naming group, rank and method, and `RayCalls`.
- `future`: `GroupFuture` and `wait_all`, which wait through those handles whatever transport sent them.
- `hosts`: the process each rank runs in, which becomes its worker; a re-placed run's new ranks take over the old
  ranks' processes on their nodes instead of starting new ones.
- `parking`: a finished run's reservation and processes, handed on to the next run of the same process and shape.
- `mailbox`, `channel`: the data plane: each process's mailbox and the keyed queues between groups.
- `serving`: `serve` and `ServedCalls`, the transport through the mailboxes, for loops where a Ray call per step
  would cost a large share of the step (benchmarks/handoff.py), and the workers' loop that answers it.
- `group`: `WorkerGroup` (method fan-out through its current transport), launching and terminating groups.
- `worker`: the `Worker` base class; `collective` and `group_mean` (tensor transfers, data-parallel means) are the
  torch-dependent parts it imports on first use.
- `cluster`: `Cluster`, the nodes and devices a run holds: checks, core sets, reservations, and the groups it tears
  down; it uses `session` to start and stop Ray.

The torch-dependent names are imported on first use (PEP 562): the hub's process imports the channel and
rendezvous modules, and importing this package there must not pull in torch (its start-up time and memory, in every
such process). The light modules (errors, timer) are imported at once; this also keeps the name `timer` bound to the
decorator rather than to its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplace.lazy import lazy_exports
from rlplace.scheduler.errors import ChannelError, ChannelTimeout, ClusterError, WorkerError, WorkerTimeout
from rlplace.scheduler.timer import timer

if TYPE_CHECKING:
    from rlplace.scheduler.channel import Channel
    from rlplace.scheduler.cluster import Cluster, check_start
    from rlplace.scheduler.future import GroupFuture, wait_all
    from rlplace.scheduler.group import StartingGroup, WorkerGroup, WorkerGroupSpec, wait_started
    from rlplace.scheduler.serving import serve
    from rlplace.scheduler.worker import Worker

_MODULE_OF = {
    "Channel": "channel",
    "Cluster": "cluster",
    "GroupFuture": "future",
    "StartingGroup": "group",
    "Worker": "worker",
    "WorkerGroup": "group",
    "WorkerGroupSpec": "group",
    "serve": "serving",
    "check_start": "cluster",
    "wait_all": "future",
    "wait_started": "group",
}
__all__ = [
    "Channel",
    "ChannelError",
    "ChannelTimeout",
    "Cluster",
    "ClusterError",
    "GroupFuture",
    "StartingGroup",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupSpec",
    "WorkerTimeout",
    "check_start",
    "serve",
    "timer",
    "wait_all",
    "wait_started",
]

__getattr__ = lazy_exports(__name__, _MODULE_OF)
