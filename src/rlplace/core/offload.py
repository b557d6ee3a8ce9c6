"""Offload and onload: moving a component's weights and optimizer state off its device while another uses it.

When components share devices (collocated or hybrid placement), the idle one moves its parameters, gradients and
optimizer state to pinned CPU memory between phases and back before it works again. On a CPU-only cluster there is
no device memory to free: the call is a recorded no-op (0 bytes moved), so the timeline still shows where it would
happen.

Sharded state (an FSDP2 actor, `actor.strategy = fsdp`) moves each rank's shards through `module._apply`, the
path of `module.to`: FSDP2 keeps views into each shard, which it re-derives after `_apply` and would lose if the
shards were swapped behind its back. The function applied copies each shard into the component's pinned host copy,
as for an unsharded model; `module.to` itself would copy into fresh pageable memory, several times slower.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from rlplace.core.sharded import is_sharded, local_part


@dataclass
class TransferRecord:
    """What one offload or onload moved and how long it took."""

    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 and self.bytes else 0.0


def _tensors(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> list[tuple[object, str, torch.Tensor]]:
    """Every (owner, attribute-or-key, tensor) that lives on the device: parameters, grads, optimizer state."""
    found: list[tuple[object, str, torch.Tensor]] = []
    for param in module.parameters():
        found.append((param, "data", param.data))
        if param.grad is not None:
            found.append((param, "grad", param.grad))
    for buffer_owner in module.modules():
        for name, buf in buffer_owner.named_buffers(recurse=False):
            found.append((buffer_owner, name, buf))
    if optimizer is not None:
        for state in optimizer.state.values():
            for key, value in state.items():
                # A 0-dim tensor is a counter (Adam's `step`), which Adam keeps on the CPU on purpose: on the device,
                # each step would wait for it, parameter by parameter. Its bytes are not worth moving anyway.
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    found.append((state, key, value))
    return found


class HostCopies:
    """The pinned host tensors one component offloads into, kept for the whole run.

    Pinning host memory costs far more than copying into it (benchmarks/gpu_suite.py, offload section), so each
    offload after the first copies into the memory the last one pinned. Left to torch's host allocator instead, an hf
    rollout engine pinned fresh memory at every sleep and never got the old blocks back
    (`torch.cuda.host_memory_stats` shows it).
    """

    def __init__(self) -> None:
        self._copies: dict[tuple[int, str], torch.Tensor] = {}

    def like(self, owner: object, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The pinned tensor kept for `owner.name`, made on first use or when its shape or dtype changed. Keyed by
        the owner's identity, which lasts as long as the parameter, module or optimizer state it names."""
        key = (id(owner), name)
        copy = self._copies.get(key)
        if copy is None or copy.shape != tensor.shape or copy.dtype != tensor.dtype:
            copy = self._copies[key] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return copy


def move(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    device: torch.device,
    host: HostCopies,
) -> TransferRecord:
    """Move a module and its optimizer state to `device`, into `host`'s pinned tensors when the target is the CPU
    (benchmarks/gpu_suite.py compares its rate with the pinned copy rate)."""
    start = time.perf_counter()
    if any(is_sharded(param) for param in module.parameters()):
        return _move_sharded(module, optimizer, device, host, start)
    moved = 0
    for owner, name, tensor in _tensors(module, optimizer):
        if tensor.device == device:
            continue
        if device.type == "cpu":
            target = _host_copy(host, owner, name, tensor)
        else:
            target = tensor.to(device, non_blocking=True)
        moved += tensor.numel() * tensor.element_size()
        if isinstance(owner, dict):
            owner[name] = target
        elif isinstance(owner, torch.nn.Parameter) and name == "data":
            owner.data = target
        elif isinstance(owner, torch.nn.Parameter):
            owner.grad = target
        else:
            owner._buffers[name] = target  # noqa: SLF001 - the documented way to swap a registered buffer
    if moved and torch.cuda.is_available():
        torch.cuda.synchronize()
        if device.type == "cpu":
            torch.cuda.empty_cache()
    return TransferRecord(moved, time.perf_counter() - start)


def _move_sharded(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    device: torch.device,
    host: HostCopies,
    start: float,
) -> TransferRecord:
    """`move` for a module whose parameters are shards (DTensors): this rank's shards, their gradients, the buffers
    and the optimizer state go to `device`."""
    found = _tensors(module, optimizer)
    away = [(owner, name, tensor) for owner, name, tensor in found if local_part(tensor).device != device]
    moved = sum(local_part(tensor).numel() * local_part(tensor).element_size() for _, _, tensor in away)
    if not moved:
        return TransferRecord(0, time.perf_counter() - start)
    to_cpu = device.type == "cpu"
    if to_cpu:
        order = itertools.count()  # `_apply` visits the same tensors in the same order at every offload

        def to_host(tensor: torch.Tensor) -> torch.Tensor:
            name = f"shard {next(order)}"
            # A tied weight is visited once per module that holds it, and moved at the first visit.
            return tensor if local_part(tensor).device == device else _host_copy(host, module, name, tensor)

        module._apply(to_host)  # noqa: SLF001 - the one path on which FSDP2 re-derives its views of the shards
    else:
        module.to(device)  # parameters, their gradients and buffers; FSDP2 re-derives its views of the shards
    for owner, name, tensor in away:
        if isinstance(owner, dict):  # optimizer state
            owner[name] = _host_copy(host, owner, name, tensor) if to_cpu else tensor.to(device, non_blocking=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        if to_cpu:
            torch.cuda.empty_cache()
    return TransferRecord(moved, time.perf_counter() - start)


def _host_copy(host: HostCopies, owner: object, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` copied (asynchronously) into its pinned host copy; a shard comes back as a shard of the same
    distributed tensor whose local part is that copy."""
    local = local_part(tensor)
    target = host.like(owner, name, local)
    target.copy_(local, non_blocking=True)
    if not is_sharded(tensor):
        return target
    from torch.distributed.tensor import DTensor  # imported already where a tensor is sharded

    # Wrapped as FSDP2 wraps its CPU-offloaded shards: `DTensor.from_local` would move the local part back to the
    # mesh's device type (CUDA), which is what offloading is to avoid.
    return DTensor(target, tensor._spec, requires_grad=False)  # noqa: SLF001 - the shard's own mesh, placements, shape
