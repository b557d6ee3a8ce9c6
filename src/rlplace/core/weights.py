"""Weight sync: actor rank 0 broadcasts its weights to every rollout rank, in buckets.

Sending the whole state dict as one message needs a second full copy of the weights in flight; buckets of about
`weight_sync.bucket_mb` bound that, which matters for LLM-sized policies. A header with the bucket count goes first,
so the receiver knows how many messages make one update. When the actor's ranks each hold a shard of every tensor
(`actor.strategy = fsdp`), every rank takes part: each bucket is gathered into full tensors (`full_tensor()`) and rank 0
sends it, so no rank ever holds more than one bucket of the whole model beyond its shards.
"""

from __future__ import annotations

import torch

from rlplace.core.sharded import gathered
from rlplace.scheduler import Worker


class StaleWeightsError(RuntimeError):
    """A rollout was asked to act with weights other than the version the actor last trained (synchronous
    training never acts on stale weights)."""


def buckets(state: dict[str, torch.Tensor], bucket_mb: float) -> list[dict[str, torch.Tensor]]:
    """Split a state dict, in order, into dicts of at most `bucket_mb` MB each (a larger tensor travels alone)."""
    limit = bucket_mb * 1e6
    out: list[dict[str, torch.Tensor]] = [{}]
    size = 0.0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if out[-1] and size + nbytes > limit:
            out.append({})
            size = 0.0
        out[-1][name] = tensor.detach()
        size += nbytes
    return out


def broadcast_weights(worker: Worker, model: torch.nn.Module, version: int, dst_group: str, bucket_mb: float) -> int:
    """Send `model`'s weights, labelled `version`, from rank 0 to every rank of `dst_group`; returns the number of
    buckets. Every rank of a sharded model calls it (the gathers are collective); other ranks of a replicated one may
    too, and send nothing."""
    parts = buckets(model.state_dict(), bucket_mb)  # a sharded tensor's size is its whole size
    sender = worker.rank == 0
    if sender:
        worker.broadcast({"num_buckets": torch.tensor(len(parts)), "version": torch.tensor(version)}, dst_group)
    for part in parts:
        full = {name: gathered(tensor) for name, tensor in part.items()}
        if sender:
            worker.broadcast(full, dst_group)
    return len(parts)


@torch.no_grad()
def receive_weights(worker: Worker, model: torch.nn.Module, src_group: str) -> int:
    """Receive what `broadcast_weights` sends from rank 0 of `src_group` into `model`, in place; returns its version."""
    header = worker.recv(src_group, 0)
    state = model.state_dict()
    for _ in range(int(header["num_buckets"])):
        for name, tensor in worker.recv(src_group, 0).items():
            state[name].copy_(tensor)
    return int(header["version"])


def receive_state(worker: Worker, src_group: str) -> tuple[int, dict[str, torch.Tensor]]:
    """Receive what `broadcast_weights` sends as a whole state dict, for holders that load weights themselves
    (an inference engine whose parameters are not a torch module of ours); returns (version, state)."""
    header = worker.recv(src_group, 0)
    state: dict[str, torch.Tensor] = {}
    for _ in range(int(header["num_buckets"])):
        state.update(worker.recv(src_group, 0))
    return int(header["version"]), state
