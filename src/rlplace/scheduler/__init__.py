"""rlplace.scheduler: the only layer that talks to Ray.

`Cluster` holds the Ray cluster and its devices; `Worker` subclasses are launched as `WorkerGroup`s (several side by
side with `start` and `wait_started`) whose method calls fan out to every rank and return a `GroupFuture` (`wait_all`
waits on several at once); `Channel` queues data between groups; `Worker.broadcast` and `Worker.recv` move tensors
between groups; `@timer` records where the time went; `serve` sends a group's calls through the mailboxes instead of
Ray, for loops that call every few milliseconds.

    with Cluster(cfg.cluster) as cluster:
        actor = ActorWorker.create_group(cfg).launch(cluster, name="actor", placement_strategy=strategy)
        losses = actor.run_training().wait()  # one result per rank

The torch-dependent names are imported on first use (PEP 562): Ray starts a process for every channel and
rendezvous actor, and importing this package there must not pull in torch (a second and a few hundred MB per
process). The light modules (errors, timer) are imported at once; this also keeps the name `timer` bound to the
decorator rather than to its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplace.lazy import lazy_exports
from rlplace.scheduler.errors import ChannelError, ChannelTimeout, ClusterError, WorkerError, WorkerTimeout
from rlplace.scheduler.timer import timer

if TYPE_CHECKING:
    from rlplace.scheduler.channel import Channel
    from rlplace.scheduler.cluster import Cluster
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
    "serve",
    "timer",
    "wait_all",
    "wait_started",
]

__getattr__ = lazy_exports(__name__, _MODULE_OF)
