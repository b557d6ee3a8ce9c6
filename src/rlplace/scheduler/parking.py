"""A run's devices and worker processes, handed on to the next run of the same process on the same Ray.

The runs one process starts on an embedded Ray of its own (a multirun's jobs, `Cluster(keep_ray=True)`; the runs of
a test module on its shared Ray) would each reserve the same devices and start the same worker processes, most of a
short run's start-up. Instead a run that ends cleanly parks its reservation and its workers' processes, retired
(`hosts.py`), and the next run takes them over if it has the same nodes and devices: it holds the devices at once,
and its ranks become workers in processes that have already started and imported torch. A run of another shape
releases what is parked, then reserves its own. Nothing is parked on a Ray this process joined (a cluster at
`cluster.address`, a job of Hydra's Ray launcher): devices held between runs would keep other drivers waiting.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import ray

from rlplace.scheduler.hosts import IdleHosts
from rlplace.scheduler.reservation import Bundle, Reservation


@dataclass(frozen=True)
class Parked:
    """A finished run's reservation and retired processes, on the nodes and bundles they were made for."""

    job_id: str
    """The Ray connection they belong to (handles of an ended one mean nothing)."""
    made_for: str
    """The nodes and bundles of the reservation (`_made_for`)."""
    reservation: Reservation
    idle: IdleHosts

    def release(self) -> None:
        self.idle.stop()
        self.reservation.release()


_parked: Parked | None = None


def park(reservation: Reservation, idle: IdleHosts, node_ids: Sequence[str], bundles: Sequence[list[Bundle]]) -> None:
    """Keep a finished run's reservation and processes for the next run of this process (releasing older ones)."""
    global _parked
    take(node_ids, bundles)
    _parked = Parked(_job_id(), _made_for(node_ids, bundles), reservation, idle)


def take(node_ids: Sequence[str], bundles: Sequence[list[Bundle]]) -> Parked | None:
    """What the last run parked, if it was made for these nodes and bundles; otherwise it is released, and None."""
    global _parked
    parked, _parked = _parked, None
    if parked is None or parked.job_id != _job_id():
        return None
    if parked.made_for == _made_for(node_ids, bundles):
        return parked
    parked.release()
    return None


def forget() -> None:
    """Drop what is parked without releasing it: the Ray it lives in is about to stop, taking it along."""
    global _parked
    _parked = None


def _job_id() -> str:
    return ray.get_runtime_context().get_job_id()


def _made_for(node_ids: Sequence[str], bundles: Sequence[list[Bundle]]) -> str:
    return json.dumps([list(node_ids), list(bundles)], sort_keys=True)
