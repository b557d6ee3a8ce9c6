"""Tensor transfers between ranks of two worker groups (weight sync, rollout batches), over torch.distributed.

Each pair of communicating ranks gets its own communicator, created lazily on first use: a private TCPStore and a
`ProcessGroupGloo` object over it, plus a `ProcessGroupNCCL` when CUDA tensors cross between two GPUs. These
objects are never registered as torch.distributed groups, so they neither need `init_process_group` nor clash with
the default process group that a group's own ranks use for data parallelism (`Worker.init_process_group`).

Rendezvous: the pair's first member (in a canonical order both sides compute) opens the TCPStore on a port the OS
picks and publishes the address through the cluster's rendezvous (rendezvous.py); the other member waits for
it there. So both sides may start at the same time, and no port is guessed.

Payloads are a tensor or nested dicts/lists/tuples of tensors; non-tensor leaves travel in a pickled header that
also gives every tensor's shape, dtype and transport:

- CPU tensors: gloo, the small ones packed into one buffer (`PACK_BELOW`);
- CUDA tensors between different GPUs: NCCL;
- CUDA tensors between processes on one GPU: CUDA IPC (NCCL refuses two ranks on one device). The receiver opens
  the sender's memory, copies it, and acknowledges, so the sender keeps the tensor alive until then.

A gloo message between two processes that share a core costs about a scheduler tick, whatever its size, where
processes on two cores exchange one in a fraction of a millisecond (one side busy-waits while the other needs the
core; benchmarks/scheduler_bench.py times weight syncs both ways). So a transfer sends as few messages as it can: a
first message of fixed size (`FIRST_MESSAGE_BYTES`) carries the header's length, then the header and the packed
tensors where they fit; only what does not fit follows, the header, the packed buffer and each large tensor as one
message each. A small payload (a small policy's weights) is one message.

A broadcast sends the payload to every rank of the destination group, all at once (to a group of one rank, it is a
point-to-point send); each of them receives it with `recv`. Transfers between two ranks must be issued in the same
order on both sides, as with any point-to-point protocol.
"""

from __future__ import annotations

import contextlib
import math
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import ray
import torch
import torch.distributed as dist

from rlplace.scheduler.errors import ChannelError
from rlplace.scheduler.hub import Hosted

if TYPE_CHECKING:
    from rlplace.scheduler.context import WorkerContext

Payload = Any
"""A tensor, or dicts/lists/tuples nesting tensors and plain picklable values."""

TIMEOUT = timedelta(seconds=300)
"""How long a rank waits for its peer to join a communicator or to complete a transfer."""


FIRST_MESSAGE_BYTES = 64 << 10
"""The size of a transfer's first message: the header's length, then the header and the packed tensors if they fit."""
PACK_BELOW = 16 << 20
"""CPU tensors of fewer bytes travel packed into one buffer: copying one costs less than a message of its own would
between processes that share a core (a scheduler tick)."""
_ALIGN = 64
"""Packed tensors start at multiples of this many bytes, so that each is a view of the buffer in its own dtype."""
_LENGTH = torch.int64.itemsize
"""Bytes of the header's length at the start of the first message."""


@dataclass(frozen=True)
class _TensorSlot:
    """Where a tensor sat in the payload, and how it travels."""

    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    transport: str  # "gloo" | "nccl" | "ipc"
    ipc_handle: tuple[Callable[..., torch.Tensor], tuple[Any, ...]] | None = None
    offset: int | None = None
    """Where a packed CPU tensor starts in the packed buffer; None for one that travels on its own."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Transfers:
    """One worker's end of group-to-group transfers, with a communicator per peer rank."""

    def __init__(self, context: WorkerContext, device: torch.device) -> None:
        self._context = context
        self._device = device
        self._groups: dict[str, tuple[str, int]] = {}
        self._comms: dict[tuple[str, int], _PairComm] = {}

    def recv(self, group: str, rank: int) -> Payload:
        comm = self._comm(group, rank)
        with _peer_failures(f"transfer from group {group!r} rank {rank}"):
            return comm.recv()

    def broadcast(self, payload: Payload, group: str) -> None:
        _, world_size = self._peer_group(group)
        comms = [self._comm(group, rank) for rank in range(world_size)]
        tensors: list[torch.Tensor] = []
        skeleton = _strip_tensors(payload, tensors)
        tensors = [t.detach().contiguous() for t in tensors]
        offsets, packed = _pack(tensors)  # the CPU tensors, the same for every receiver
        # Per receiver, how its CUDA tensors travel: a GPU may be shared with some receivers, not others.
        plans = [comm.plan(skeleton, tensors, offsets, packed) for comm in comms]
        # Sends are asynchronous: start the transfer to every rank before waiting for any of them.
        pending = [
            work
            for comm, (messages, slots) in zip(comms, plans, strict=True)
            for work in comm.start_send(messages, tensors, slots)
        ]
        with _peer_failures(f"transfer to group {group!r}"):
            for work in pending:
                work.wait()
        for comm, (_, slots) in zip(comms, plans, strict=True):
            comm.finish_send(slots)

    def _peer_group(self, name: str) -> tuple[str, int]:
        if name not in self._groups:
            rendezvous = Hosted(self._context.rendezvous)
            found = ray.get(rendezvous.group.remote(name))
            if found is None:
                raise ValueError(f"no worker group named {name!r} has been launched on this cluster")
            self._groups[name] = found
        return self._groups[name]

    def _comm(self, group: str, rank: int) -> _PairComm:
        uid, world_size = self._peer_group(group)
        if not 0 <= rank < world_size:
            raise ValueError(f"group {group!r} has ranks 0..{world_size - 1}, not {rank}")
        if (uid, rank) not in self._comms:
            me = (self._context.group_uid, self._context.placement.rank)
            self._comms[uid, rank] = _PairComm(me, (uid, rank), self._context.rendezvous, self._device)
        return self._comms[uid, rank]


@contextlib.contextmanager
def _peer_failures(where: str) -> Iterator[None]:
    """A transfer that fails in torch.distributed (gloo: "Connection reset by peer") failed because the other end did:
    a ChannelError, which the driver reports as the symptom it is, naming the peer's own failure instead."""
    try:
        yield
    except RuntimeError as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ChannelError(f"{where}: the connection failed ({detail})") from error


class _PairComm:
    """A communicator between two ranks: its own TCPStore and gloo group, and an NCCL group on first need."""

    def __init__(self, me: tuple[str, int], peer: tuple[str, int], rendezvous: str, device: torch.device) -> None:
        first, second = sorted([me, peer])
        key = f"{first[0]}:{first[1]}|{second[0]}:{second[1]}"
        self.rank = 0 if me == first else 1
        self.peer = 1 - self.rank
        self.device = device
        host = ray.util.get_node_ip_address()
        actor = Hosted(rendezvous)
        if self.rank == 0:
            self.store = dist.TCPStore(host, 0, None, True, TIMEOUT, wait_for_workers=False)
            ray.get(actor.publish.remote(key, (host, self.store.port)))
        else:
            address = ray.get(actor.lookup.remote(key, TIMEOUT.total_seconds()))
            if address is None:
                raise TimeoutError(f"peer {first} did not open communicator {key} within {TIMEOUT}")
            self.store = dist.TCPStore(address[0], address[1], None, False, TIMEOUT)
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        options._timeout = TIMEOUT
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", self.store), self.rank, 2, options)
        # Each side announces its physical GPU ("" without one), so CUDA transfers can tell NCCL from CUDA IPC.
        self.gpu = str(torch.cuda.get_device_properties(device).uuid) if device.type == "cuda" else ""
        self.store.set(f"gpu{self.rank}", self.gpu)
        self._peer_gpu: str | None = None
        self._nccl: Any = None

    def plan(
        self, skeleton: Any, tensors: list[torch.Tensor], offsets: list[int | None], packed: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[_TensorSlot]]:
        """The messages that announce a payload (`skeleton`, its `tensors` and their packing) to the receiver (its
        first message, then the header and the packed buffer where they do not fit in it), and how each tensor
        travels."""
        slots = [
            _TensorSlot(i, tuple(t.shape), t.dtype, self._transport(t), offset=offset)
            for i, (t, offset) in enumerate(zip(tensors, offsets, strict=True))
        ]
        if any(slot.transport == "ipc" for slot in slots):
            torch.cuda.current_stream(self.device).synchronize()  # the receiver reads the memory on its own stream
            slots = [_with_ipc_handle(slot, tensors[slot.index]) for slot in slots]
        size = packed.numel()
        header = pickle.dumps((skeleton, slots, size))
        first = torch.empty(FIRST_MESSAGE_BYTES, dtype=torch.uint8)
        first[:_LENGTH].copy_(torch.tensor([len(header)], dtype=torch.int64).view(torch.uint8))
        messages = [first]
        in_first = (
            (_header_at(len(header)), torch.frombuffer(bytearray(header), dtype=torch.uint8)),
            (_packed_at(len(header), size), packed),
        )
        for start, data in in_first:
            if start is not None:
                first[start : start + data.numel()].copy_(data)
            elif data.numel():
                messages.append(data)
        return messages, slots

    def start_send(
        self, messages: list[torch.Tensor], tensors: list[torch.Tensor], slots: list[_TensorSlot]
    ) -> list[Any]:
        """Start sending the messages and the tensors that travel on their own; the caller waits on the returned
        works, then calls `finish_send`."""
        works = [self.gloo.send([message], self.peer, 0) for message in messages]
        for slot, tensor in zip(slots, tensors, strict=True):
            if slot.transport == "gloo" and slot.offset is None and tensor.numel():
                works.append(self.gloo.send([_as_bytes(tensor)], self.peer, 0))
            elif slot.transport == "nccl" and tensor.numel():
                works.append(self._nccl_group().send([tensor], self.peer, 0))
        return works

    def finish_send(self, slots: list[_TensorSlot]) -> None:
        """Wait until the receiver has copied the tensors shared through CUDA IPC; they must stay alive until then."""
        if any(slot.transport == "ipc" for slot in slots):
            self.gloo.recv([torch.empty(1, dtype=torch.uint8)], self.peer, 0).wait()

    def recv(self) -> Payload:
        first = self._recv_bytes(FIRST_MESSAGE_BYTES)
        length = int(first[:_LENGTH].view(torch.int64).item())
        at = _header_at(length)
        header = first[at : at + length] if at is not None else self._recv_bytes(length)
        skeleton, slots, size = pickle.loads(header.numpy().tobytes())
        packed_at = _packed_at(length, size)
        packed = first[packed_at : packed_at + size] if packed_at is not None else self._recv_bytes(size)
        tensors = [self._recv_tensor(slot, packed) for slot in slots]
        if any(slot.transport == "ipc" for slot in slots):
            torch.cuda.current_stream(self.device).synchronize()
            self.gloo.send([torch.ones(1, dtype=torch.uint8)], self.peer, 0).wait()
        return _restore_tensors(skeleton, tensors)

    def _recv_bytes(self, size: int) -> torch.Tensor:
        buffer = torch.empty(size, dtype=torch.uint8)
        if size:
            self.gloo.recv([buffer], self.peer, 0).wait()
        return buffer

    def _recv_tensor(self, slot: _TensorSlot, packed: torch.Tensor) -> torch.Tensor:
        if slot.transport == "ipc":
            rebuild, args = slot.ipc_handle
            return rebuild(*args).clone()
        if slot.offset is not None:
            return packed[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).reshape(slot.shape)
        device = self.device if slot.transport == "nccl" else torch.device("cpu")
        tensor = torch.empty(slot.shape, dtype=slot.dtype, device=device)
        if tensor.numel() and slot.transport == "gloo":
            self.gloo.recv([_as_bytes(tensor)], self.peer, 0).wait()
        elif tensor.numel():
            self._nccl_group().recv([tensor], self.peer, 0).wait()
        return tensor

    def _transport(self, tensor: torch.Tensor) -> str:
        if not tensor.is_cuda:
            return "gloo"
        if tensor.device != self.device:
            raise ValueError(f"CUDA tensors must be on the worker's device ({self.device}), got {tensor.device}")
        if self._peer_gpu is None:
            self._peer_gpu = self.store.get(f"gpu{self.peer}").decode()
        if not self._peer_gpu:
            raise ValueError("the receiving worker has no GPU; send CPU tensors to it")
        return "ipc" if self._peer_gpu == self.gpu else "nccl"

    def _nccl_group(self) -> Any:
        if self._nccl is None:
            torch.cuda.set_device(self.device)
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = TIMEOUT
            self._nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", self.store), self.rank, 2, options)
        return self._nccl


def _aligned(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def _pack(tensors: list[torch.Tensor]) -> tuple[list[int | None], torch.Tensor]:
    """The CPU tensors below `PACK_BELOW` bytes copied into one buffer: each tensor's offset there (None for one that
    travels on its own) and the buffer."""
    offsets: list[int | None] = []
    size = 0
    for tensor in tensors:
        packs = not tensor.is_cuda and 0 < tensor.nbytes < PACK_BELOW
        offsets.append(size if packs else None)
        size += _aligned(tensor.nbytes) if packs else 0
    packed = torch.empty(size, dtype=torch.uint8)
    for tensor, offset in zip(tensors, offsets, strict=True):
        if offset is not None:
            packed[offset : offset + tensor.nbytes].copy_(_as_bytes(tensor))
    return offsets, packed


def _header_at(header_bytes: int) -> int | None:
    """Where the header starts in the first message; None where it travels on its own. Both sides compute it."""
    return _LENGTH if _LENGTH + header_bytes <= FIRST_MESSAGE_BYTES else None


def _packed_at(header_bytes: int, packed_bytes: int) -> int | None:
    """Where the packed buffer starts in the first message, after the header; None where it travels on its own."""
    if _header_at(header_bytes) is None:
        return None
    start = _aligned(_LENGTH + header_bytes)
    return start if start + packed_bytes <= FIRST_MESSAGE_BYTES else None


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor: gloo moves bytes, whatever the dtype (bool, bfloat16, ...)."""
    return tensor.reshape(-1).view(torch.uint8)


def _with_ipc_handle(slot: _TensorSlot, tensor: torch.Tensor) -> _TensorSlot:
    from torch.multiprocessing.reductions import reduce_tensor

    if slot.transport != "ipc":
        return slot
    return _TensorSlot(slot.index, slot.shape, slot.dtype, "ipc", reduce_tensor(tensor))


def _strip_tensors(payload: Payload, tensors: list[torch.Tensor]) -> Any:
    """The payload with each tensor replaced by its index in `tensors` (appended in traversal order)."""
    if isinstance(payload, torch.Tensor):
        tensors.append(payload)
        return _TensorRef(len(tensors) - 1)
    if isinstance(payload, dict):
        return {key: _strip_tensors(value, tensors) for key, value in payload.items()}
    if type(payload) in (list, tuple):
        return type(payload)(_strip_tensors(value, tensors) for value in payload)
    return payload


def _restore_tensors(skeleton: Any, tensors: list[torch.Tensor]) -> Payload:
    if isinstance(skeleton, _TensorRef):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return {key: _restore_tensors(value, tensors) for key, value in skeleton.items()}
    if type(skeleton) in (list, tuple):
        return type(skeleton)(_restore_tensors(value, tensors) for value in skeleton)
    return skeleton


@dataclass(frozen=True)
class _TensorRef:
    """Placeholder for a tensor inside a payload's header."""

    index: int
