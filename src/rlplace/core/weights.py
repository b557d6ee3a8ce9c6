"""Weight sync: actor rank 0 broadcasts its weights to every rollout rank, in buckets.

Sending the whole state dict as one message needs a second full copy of the weights in flight; buckets of about
`weight_sync.bucket_mb` bound that, which matters for LLM-sized policies. The first bucket carries the bucket count
and the version, so the receiver knows how many messages make one update, and a policy of one bucket is one message
(each costs a scheduler tick between processes that share a core: `scheduler.collective`). When the actor's ranks
each hold a shard of every tensor (`actor.strategy = fsdp`), every rank takes part: each bucket is gathered into full
tensors (`full_tensor()`) and rank 0 sends it, so no rank ever holds more than one bucket of the whole model beyond
its shards. A receiver whose model is sharded the same way (the inference group under `actor.strategy = fsdp`) keeps
its own part of each tensor it receives. A model whose receivers load other tensors than it trains (a LoRA policy:
`reasoning.lora`) sends them converted, bucket by bucket, or only some of them (`Export`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from rlplace.core.sharded import gathered, local_part, part_of
from rlplace.scheduler import Worker


class StaleWeightsError(RuntimeError):
    """A rollout was asked to act with weights other than the version the actor last trained (synchronous
    training never acts on stale weights)."""


@dataclass(frozen=True)
class Export:
    """How a model's state dict becomes the tensors its receivers load, where they differ."""

    convert: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
    """Whole tensors of one bucket -> what the receivers load."""
    unit: Callable[[str], str] | None = None
    """The entries that `convert` needs together, by a name they share: they travel in one bucket."""
    keep: Callable[[str], bool] | None = None
    """The entries sent, by name (None: all); the others are neither gathered nor sent."""


def buckets(
    state: dict[str, torch.Tensor], bucket_mb: float, unit: Callable[[str], str] | None = None
) -> list[dict[str, torch.Tensor]]:
    """Split a state dict, in order, into dicts of at most `bucket_mb` MB each (a larger tensor travels alone), never
    between consecutive entries of the same `unit`."""
    limit = bucket_mb * 1e6
    out: list[dict[str, torch.Tensor]] = [{}]
    size = 0.0
    last = None
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        together = unit is not None and unit(name) == last
        if out[-1] and size + nbytes > limit and not together:
            out.append({})
            size = 0.0
        out[-1][name] = tensor.detach()
        size += nbytes
        last = unit(name) if unit is not None else None
    return out


def broadcast_weights(
    worker: Worker,
    model: torch.nn.Module,
    version: int,
    dst_group: str,
    bucket_mb: float,
    export: Export | None = None,
) -> int:
    """Send `model`'s weights (converted by `export`), labelled `version`, from rank 0 to every rank of `dst_group`;
    returns the number of buckets. Every rank of a sharded model calls it (the gathers are collective); other ranks
    of a replicated one may too, and send nothing."""
    state = model.state_dict()
    unit = None
    if export is not None:
        unit = export.unit
        state = state if export.keep is None else {name: t for name, t in state.items() if export.keep(name)}
    parts = buckets(state, bucket_mb, unit)  # a sharded tensor's size is its whole size
    for index, part in enumerate(parts):
        full = {name: gathered(tensor) for name, tensor in part.items()}
        if worker.rank == 0:
            if export is not None:
                full = export.convert(full)
            first = {"num_buckets": len(parts), "version": version} if index == 0 else {}
            worker.broadcast({**first, "tensors": full}, dst_group)
    return len(parts)


def received_tensors(worker: Worker, src_group: str) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    """The version of one update sent by `broadcast_weights`, and its whole tensors by name, bucket by bucket: each
    later bucket is received when the one before has been consumed, so a receiver that loads them as they come holds
    one bucket beside its weights, never the whole state dict."""
    first = worker.recv(src_group, 0)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        yield from first.pop("tensors").items()
        for _ in range(first["num_buckets"] - 1):
            yield from worker.recv(src_group, 0)["tensors"].items()

    return first["version"], tensors()


def receive_weights(worker: Worker, model: torch.nn.Module, src_group: str) -> int:
    """Receive what `broadcast_weights` sends from rank 0 of `src_group` into `model`, in place (into this rank's part
    of each tensor when `model` is sharded); returns its version."""
    version, tensors = received_tensors(worker, src_group)
    load_whole(model.state_dict(), tensors)
    return version


@torch.no_grad()
def load_whole(state: dict[str, torch.Tensor], tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy whole tensors, by name, into a model's `state` dict of the same names, each into this rank's part of it
    when it is sharded."""
    for name, tensor in tensors:
        local_part(state[name]).copy_(part_of(tensor, state[name]))
