"""The process-wide transport under `Channel`: direct sockets between worker processes, no Ray call per item.

A hand-off through a Ray actor costs two actor calls (a few milliseconds on a small machine); a socket between the
two processes costs two system calls (tens of microseconds). So every process that uses a channel gets one
`Mailbox`: a listening Unix socket in the abstract namespace for peers on its node (no file to clean up) and a TCP
socket for peers on other nodes, plus one connection per peer, in both directions. Items a reader has not asked for
yet wait in its socket buffer or in its inbox, so writers never wait for a reader that is busy computing.

There is no thread: a process moves data only inside its own channel calls (`pump`), which read every connection
that has something, accept new peers and answer nothing. So a call never waits for another process to be in a
channel call, except where that is the point: a `get` on an empty key, or a `put` on a key whose bounded queue the
reader has not drained: each `get` of a bounded key sends the writer a credit (`taken`) at once. (Holding credits
back to ride with the reader's next frame saves a frame per item, but a reader whose method returns right after a
`get` would then starve its writer of room until its next channel call, which can deadlock a step.)

A frame is an 8-byte length, an envelope (what the frame is, for which queue) and a payload: an item, pickled
(protocol 5) with CPU tensors as numpy arrays and small arrays as their raw bytes (torch's own pickling of a tensor
costs many times as much, and a view sends only its own elements). The reader
unpickles an item only when a `get` takes it. The first frame on a connection is the connecting peer's `hello`: the
listener's token, which only the registry hands out, and the peer's address.

A writer never waits for a reader to be in a channel call, however large the items. A Unix socket asks for a send
buffer of `SEND_BUFFER_BYTES` (the OS caps it at net.core.wmem_max: 208 KB by default, more where tuned). A frame
above `LARGE_BYTES` that the socket has no room for, because the item is large or the reader is busy (an actor
training while the rollout hands over a step's trajectories), goes into an anonymous memory file (`memfd_create`)
instead, and the socket carries only a small `fd` frame with the file's descriptor attached (SCM_RIGHTS). The file
has no name: it is freed once the reader has read it, or with the connection if the reader dies, and leaves nothing
behind. It costs page faults a socket's recycled buffers do not, hence sockets first (benchmarks/handoff.py).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import importlib
import io
import os
import pickle
import secrets
import selectors
import socket
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import ray

from rlplace.scheduler.context import WorkerContext
from rlplace.scheduler.errors import ChannelError

_HEADER = struct.Struct("!Q")
"""Each frame starts with its length and its envelope's: `_HEADER` twice, then the envelope, then the payload."""
_SMALL_ARRAY_BYTES = 64 << 10
"""Arrays up to this size travel as raw bytes with dtype and shape (`_array`)."""
_POLL_ALONE_S = 0.0003
"""A polling `get` (`spin_s`) yields the core between polls once it has waited this long: about the longest unit of
work a lockstep peer does between hand-offs (a CartPole step of 32 envs), so the common wait polls
alone and a longer one (a peer that waits for its own core, another run's process on this one) lets others run."""
_WAIT_AVERAGING = 0.25
"""Weight of the latest wait in `_Inbox.typical_wait_s`: a few slow waits in a row stop the polling, a few fast ones
start it again."""
_RECV_BYTES = 64 << 10
"""Read at most this much per call: a buffer this small is allocated without mapping fresh pages."""
LARGE_BYTES = 64 << 10
"""Frames above this size to a peer on the node travel in an anonymous memory file when its socket lacks room."""
SEND_BUFFER_BYTES = 8 << 20
"""The send buffer a Unix socket asks for."""
_ANCILLARY_BYTES = socket.CMSG_SPACE(16 * 4)
"""Room for descriptors per read of a Unix socket: Linux hands over one sent message's (here one) per read."""
_OUT_OF_BAND = hasattr(os, "memfd_create")

_NOT_IN_NUMPY = {"torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2", "torch.complex32"}
"""Tensor dtypes numpy has no type for (compared by name, so that this module need not import torch)."""

QueueId = tuple[str, Hashable]
"""A channel's id and one of its keys: one FIFO."""


@dataclass(frozen=True, eq=False)
class Address:
    """How to reach a mailbox: its node, its sockets, the token it accepts, and the name errors give it. Two
    addresses are equal when their tokens are, which are random and one per mailbox: every item's send looks its reader
    up by address, and 16 bytes compare and hash faster than every field."""

    node_id: str
    unix: str
    host: str
    port: int
    token: bytes
    name: str
    cores: tuple[int, ...] = ()
    """The CPU cores the process is pinned to; empty when it is not pinned."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Address) and self.token == other.token

    def __hash__(self) -> int:
        return hash(self.token)


@dataclass(eq=False)
class _Peer:
    """One connection to another process, and what has been read from it but not yet parsed."""

    sock: socket.socket
    address: Address | None = None
    """The other process's mailbox; None on an accepted connection until its hello proved it."""
    buffer: bytearray = field(default_factory=bytearray)
    fds: deque[int] = field(default_factory=deque)
    """Memory files received with the frames read so far and not yet read themselves, oldest first."""
    closed: bool = False

    @property
    def local(self) -> bool:
        """On this node: a Unix socket, which can pass descriptors."""
        return self.sock.family == socket.AF_UNIX

    def has_room(self, size: int) -> bool:
        """Whether a frame of `size` bytes fits the socket's send buffer beside what the reader has not read yet,
        with room to spare for the kernel's own overhead per buffer."""
        queued = struct.unpack("i", fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        return queued + 2 * size <= self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)

    @property
    def name(self) -> str:
        return "a process that has not said hello" if self.address is None else self.address.name


@dataclass
class _Inbox:
    """One FIFO this process reads: items with the peer that sent each (None: this process, or the registry's
    backlog), and every peer that ever wrote to it (for the one-writer rule of bounded keys and for naming the
    writer that died)."""

    items: deque[tuple[Any, _Peer | None]] = field(default_factory=deque)
    writers: set[_Peer] = field(default_factory=set)
    typical_wait_s: float = 0.0
    """A moving average of how long a `get` with `spin_s` waited here for an item (`Mailbox.receive`)."""


class _Pickler(pickle.Pickler):
    """pickle, with CPU tensors that numpy can hold pickled as numpy arrays, and numpy arrays of plain dtypes as
    their raw bytes, dtype and shape (`_array`): cheaper than numpy's own pickling each way for the small arrays of a
    hand-off (benchmarks/handoff.py). A larger array goes as numpy pickles it, written straight into the frame: a copy
    of it first would cost more than the calls saved."""

    def reducer_override(self, obj: Any) -> Any:
        numpy = sys.modules.get("numpy")  # a process without numpy holds no arrays
        if (
            numpy is not None
            and type(obj) is numpy.ndarray
            and obj.nbytes <= _SMALL_ARRAY_BYTES
            and obj.dtype.fields is None
            and not obj.dtype.hasobject
        ):
            return _array, (bytearray(obj if obj.flags.c_contiguous else obj.copy()), obj.dtype.str, obj.shape)
        torch = sys.modules.get("torch")  # a process without torch holds no tensors
        if (
            torch is not None
            and type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and not obj.requires_grad
            and str(obj.dtype) not in _NOT_IN_NUMPY
        ):
            return torch.from_numpy, (obj.numpy(),)
        return NotImplemented


def _array(data: bytearray, dtype: str, shape: tuple[int, ...]) -> Any:
    """An array `_Pickler` sent as raw bytes, over the bytes received (writable, no copy)."""
    numpy = sys.modules.get("numpy") or importlib.import_module("numpy")
    return numpy.frombuffer(data, dtype).reshape(shape)


def _frame(envelope: tuple[Any, ...], *item: Any) -> memoryview:
    """A whole frame: its length, its envelope's length, the envelope, and the pickled `item` if given (what
    `_unframe` reads), written into one buffer, so that a large item is copied once."""
    buffer = io.BytesIO()
    buffer.write(bytes(2 * _HEADER.size))
    pickle.dump(envelope, buffer, protocol=5)
    head_end = buffer.tell()
    if item:
        _Pickler(buffer, protocol=5).dump(item[0])
    frame = buffer.getbuffer()
    _HEADER.pack_into(frame, 0, len(frame) - _HEADER.size)
    _HEADER.pack_into(frame, _HEADER.size, head_end - 2 * _HEADER.size)
    return frame


class _Pickled:
    """An item as it arrived, unpickled only when a `get` takes it: a process woken by items it will take later (an
    actor while the rollout hands over trajectories) pays only the read then, not the unpickling."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _item(stored: Any) -> Any:
    return pickle.loads(stored.data) if type(stored) is _Pickled else stored


def _process_cores() -> tuple[int, ...]:
    """The cores this process is pinned to (`worker.pin_process`); empty when it may run on any."""
    cores = os.sched_getaffinity(0)
    return tuple(sorted(cores)) if len(cores) < (os.cpu_count() or 0) else ()


def _process_name() -> str:
    context = WorkerContext.from_env()
    if context is None:
        return f"the driver (pid {os.getpid()})"
    return f"{context.group_name} rank {context.placement.rank} (pid {os.getpid()})"


class Mailbox:
    """This process's end of every channel: its listening sockets, its peers, the FIFOs it reads, and its credit
    on the bounded FIFOs it writes. Use `mailbox()`; calls from several threads take turns."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.selector = selectors.DefaultSelector()
        token = secrets.token_bytes(16)
        unix_name = f"\0rlplace-{os.getpid()}-{secrets.token_hex(8)}"  # "\0": the abstract namespace, no file
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(unix_name)
        host = ray.util.get_node_ip_address()
        tcp = socket.create_server((host, 0), backlog=64)
        for listener in (unix, tcp):
            listener.listen(64)
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, None)
        self.address = Address(
            node_id=ray.get_runtime_context().get_node_id(),
            unix=unix_name,
            host=host,
            port=tcp.getsockname()[1],
            token=token,
            name=_process_name(),
            cores=_process_cores(),
        )
        self.pinned_to = frozenset(self.address.cores)
        self.in_actor = ray.get_runtime_context().get_actor_id() is not None
        self.peers: dict[Address, _Peer] = {}
        """Connections this process opened, by the address they go to."""
        self.readers: dict[QueueId, Address] = {}
        """The reader of every queue this process has written to or read, once the registry named it."""
        self.inboxes: dict[QueueId, _Inbox] = {}
        self.in_flight: dict[QueueId, int] = {}
        """Per bounded FIFO this process writes to elsewhere: items sent that the reader has not taken yet."""

    # -- writing -------------------------------------------------------------------------------------------------

    def send(self, to: Address, queue: QueueId, item: Any, maxsize: int, deadline: float | None, where: str) -> bool:
        """Send `item` into `queue`, read by the mailbox at `to`; False when a bounded queue stayed full until
        `deadline` (a `time.monotonic()` value, None: no limit). Raises ChannelError, starting with `where`, when
        the reader is gone."""
        gone = f"{where}: its reader, {to.name}, is gone"
        peer = self._connect(to, gone)
        if maxsize > 0:
            while self.in_flight.get(queue, 0) >= maxsize:
                if peer.closed:
                    raise ChannelError(gone)
                if not self.pump(deadline):
                    return False
            self.in_flight[queue] = self.in_flight.get(queue, 0) + 1
        self._write(peer, ("put", queue), gone, item)
        return True

    def _connect(self, to: Address, gone: str) -> _Peer:
        peer = self.peers.get(to)
        if peer is not None and not peer.closed:
            return peer
        if to.node_id == self.address.node_id:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            target: Any = to.unix
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = (to.host, to.port)
        try:
            sock.connect(target)
        except OSError as error:
            sock.close()
            raise ChannelError(f"{gone} ({error.strerror.lower()} at {target!r})") from error
        peer = self.peers[to] = self._add_peer(sock, to)  # it is this side that proves itself, with the hello
        self._write(peer, ("hello", to.token, self.address), gone)
        return peer

    def _add_peer(self, sock: socket.socket, address: Address | None) -> _Peer:
        sock.setblocking(False)
        peer = _Peer(sock, address)
        self.selector.register(sock, selectors.EVENT_READ, peer)
        return peer

    def _write(self, peer: _Peer, envelope: tuple[Any, ...], gone: str, *item: Any) -> None:
        """Send one frame: an envelope (what it is, for which queue) and a payload (a pickled item, which the reader
        unpickles only when a `get` takes it). A large frame that the socket of a peer on the node has no room for
        goes as a memory file; while the peer's socket is full, keep reading every connection, so that two processes
        sending to each other at once cannot both block."""
        frame = _frame(envelope, *item)
        if not (_OUT_OF_BAND and peer.local and len(frame) > LARGE_BYTES and not peer.has_room(len(frame))):
            self._send(peer, frame, None, gone)
            return
        fd = os.memfd_create("rlplace-item", os.MFD_CLOEXEC)
        try:
            _write_all(fd, frame[_HEADER.size :])
            self._send(peer, _frame(("fd", len(frame) - _HEADER.size)), fd, gone)
        finally:
            os.close(fd)  # the socket holds its own reference until the reader takes it

    def _send(self, peer: _Peer, data: bytes | memoryview, fd: int | None, gone: str) -> None:
        """Send `data`, with descriptor `fd` attached to its first byte when given."""
        view = memoryview(data)
        while view:
            if peer.closed:
                raise ChannelError(gone)
            try:
                if fd is None:
                    sent = peer.sock.send(view)
                else:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                    sent, fd = peer.sock.sendmsg([view], rights), None
                view = view[sent:]
            except BlockingIOError:
                self._wait_writable(peer)
            except OSError as error:
                self._close(peer)
                raise ChannelError(gone) from error

    def _wait_writable(self, peer: _Peer) -> None:
        self.selector.modify(peer.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)
        try:
            self.pump(time.monotonic() + 1.0)
        finally:
            if not peer.closed:
                self.selector.modify(peer.sock, selectors.EVENT_READ, peer)

    # -- reading -------------------------------------------------------------------------------------------------

    def inbox(self, queue: QueueId) -> _Inbox:
        if queue not in self.inboxes:
            self.inboxes[queue] = _Inbox()
        return self.inboxes[queue]

    def receive(
        self, queue: QueueId, maxsize: int, deadline: float | None, where: str, spin_s: float = 0.0
    ) -> tuple[bool, Any]:
        """Take the oldest item of a queue this process reads: (True, item), or (False, None) at `deadline`.

        Gives the writer its credit back on a bounded queue. Raises ChannelError, starting with `where`, when the
        queue is empty and every process that wrote to it is gone, or when a bounded queue has a second writer.
        With `spin_s` > 0, an empty queue is polled that long before this process sleeps, if this process and every
        writer are pinned to cores and share none (`_may_spin`), and if waits here usually end within it: when the
        writer is slow (a larger unit of work, or a machine busy with other jobs), polling would only burn the core."""
        inbox = self.inbox(queue)
        waiting = spin_s > 0 and not inbox.items
        if waiting:
            started = time.perf_counter()
            poll_s = spin_s if inbox.typical_wait_s < spin_s and self._may_spin(inbox.writers) else 0.0
        while not inbox.items:
            if inbox.writers and all(w.closed for w in inbox.writers):
                raise ChannelError(f"{where}: its writer, {_names(inbox.writers)}, is gone")
            if not self.pump(deadline, poll_s if waiting else 0.0):
                return False, None
        if waiting:
            inbox.typical_wait_s += _WAIT_AVERAGING * (time.perf_counter() - started - inbox.typical_wait_s)
        stored, writer = inbox.items.popleft()
        item = _item(stored)
        if maxsize > 0 and writer is not None:
            if len(inbox.writers) > 1:
                raise ChannelError(
                    f"{where} has maxsize {maxsize} and several writers ({_names(inbox.writers)}): a bounded key "
                    "takes one writer, an unbounded one any number"
                )
            with contextlib.suppress(ChannelError):  # a writer that is gone needs no credit
                self._write(writer, ("taken", queue), f"{writer.name} is gone")
        return True, item

    def take_arrived(self, queue: QueueId) -> list[tuple[Any, _Peer | None]]:
        """Every item of a queue this process reads that has arrived, oldest first, with the connection each came
        on (None: put by this process or held by the registry); without waiting and without returning credit (for
        unbounded queues)."""
        self.pump(time.monotonic())
        inbox = self.inbox(queue)
        arrived = [(_item(stored), writer) for stored, writer in inbox.items]
        inbox.items.clear()
        return arrived

    def _may_spin(self, writers: set[_Peer]) -> bool:
        """Whether polling takes no core a writer computes on: this process and each writer pinned, to no common
        core. An unpinned process (the driver, a GPU worker) may share any core, so never spins."""
        mine = self.pinned_to
        return bool(mine and writers) and all(
            w.address is not None and w.address.cores and mine.isdisjoint(w.address.cores) for w in writers
        )

    def put_local(self, queue: QueueId, item: Any, maxsize: int, deadline: float | None) -> bool:
        """Append to a queue this process reads itself; False when a bounded queue stayed full until `deadline`."""
        inbox = self.inbox(queue)
        while 0 < maxsize <= len(inbox.items):
            if not self.pump(deadline):
                return False
        inbox.items.append((item, None))
        return True

    def pump(self, deadline: float | None, spin_s: float = 0.0) -> bool:
        """Wait for something to happen on any socket until `deadline`, then handle all of it: accept peers, read
        frames. False when nothing happened before the deadline. `spin_s` > 0 polls that long before sleeping."""
        events = []
        if spin_s > 0:
            start = time.perf_counter()
            while not (events := self.selector.select(0)) and (now := time.perf_counter()) < start + spin_s:
                if now > start + _POLL_ALONE_S:
                    os.sched_yield()  # a longer wait: whatever else waits for this core (a thread, a process) runs
        if not events:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            events = self.selector.select(timeout)
        for key, mask in events:
            if key.data is None:
                self._accept(key.fileobj)  # type: ignore[arg-type]
            elif mask & selectors.EVENT_READ:
                self._read(key.data)
        return bool(events)

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        if sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._add_peer(sock, None)

    def _read(self, peer: _Peer) -> None:
        try:
            if peer.local:
                chunk, ancillary, _, _ = peer.sock.recvmsg(_RECV_BYTES, _ANCILLARY_BYTES)
                for level, kind, data in ancillary:  # the descriptors of memory files, in the order sent
                    if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
                        peer.fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
            else:
                chunk = peer.sock.recv(_RECV_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(peer)
            return
        peer.buffer += chunk
        while len(peer.buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(peer.buffer)
            end = _HEADER.size + length
            if len(peer.buffer) < end:
                break
            with memoryview(peer.buffer) as view:
                envelope, payload = _unframe(view[_HEADER.size : end])
            del peer.buffer[:end]
            if envelope[0] == "fd" and peer.address is not None:
                envelope, payload = _unframe(_read_file(peer.fds.popleft(), envelope[1]))
            self._handle(peer, envelope, payload)
            if peer.closed:
                return

    def _handle(self, peer: _Peer, envelope: tuple[Any, ...], payload: bytes) -> None:
        kind = envelope[0]
        if peer.address is None:
            if kind == "hello" and secrets.compare_digest(envelope[1], self.address.token):
                peer.address = envelope[2]
            else:
                self._close(peer)  # not a process the registry introduced
        elif kind == "put":
            inbox = self.inbox(envelope[1])
            inbox.items.append((_Pickled(payload), peer))
            inbox.writers.add(peer)
        elif kind == "taken" and envelope[1] in self.in_flight:  # not yet forgotten
            self.in_flight[envelope[1]] -= 1

    def _close(self, peer: _Peer) -> None:
        if not peer.closed:
            peer.closed = True
            self.selector.unregister(peer.sock)
            peer.sock.close()
            while peer.fds:
                os.close(peer.fds.popleft())

    def forget(self, channel_id: str) -> None:
        """Drop this process's state of a closed channel."""
        for table in (self.readers, self.inboxes, self.in_flight):
            for queue in [q for q in table if q[0] == channel_id]:
                del table[queue]  # type: ignore[attr-defined]


def _unframe(frame: memoryview | bytes) -> tuple[tuple[Any, ...], bytes]:
    """A frame's envelope and payload (a copy: the frame's buffer is reused), from after its length."""
    (size,) = _HEADER.unpack_from(frame)
    start = _HEADER.size + size
    return pickle.loads(frame[_HEADER.size : start]), bytes(frame[start:])


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_file(fd: int, size: int) -> bytes:
    """The `size` bytes of a received memory file, which is then closed (and so freed)."""
    try:
        data = os.pread(fd, size, 0)
        while len(data) < size:
            data += os.pread(fd, size - len(data), len(data))
        return data
    finally:
        os.close(fd)


def _names(peers: set[_Peer]) -> str:
    return ", ".join(sorted(peer.name for peer in peers))


_MAILBOX: Mailbox | None = None
_MAILBOX_LOCK = threading.Lock()


def mailbox() -> Mailbox:
    """This process's mailbox, opened on first use (in a process connected to Ray).

    A driver may leave one Ray cluster and join another, so its mailbox is checked against the node each time; an
    actor's process lives and dies in one cluster, and skips the check (a noticeable share of a `put`)."""
    global _MAILBOX
    box = _MAILBOX
    if box is not None and box.in_actor:
        return box
    with _MAILBOX_LOCK:
        if _MAILBOX is None or _MAILBOX.address.node_id != ray.get_runtime_context().get_node_id():
            _MAILBOX = Mailbox()
        return _MAILBOX
