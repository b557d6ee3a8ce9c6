"""The Ray session a `Cluster` runs on: starting an embedded local Ray, attaching to a running one, and ending it.

This is the one module that reaches into `ray._private` (Ray's cluster-mode switch, address lookup, accelerator count,
the started node's session folder and autoscaler monitor): what Ray offers no public API for is kept here, so a Ray
upgrade that moves it breaks one file. An embedded Ray started here is stopped without leftovers: its processes and
their children are killed and reaped after `ray.shutdown()`, and its session folder is removed. `Cluster`
(`cluster.py`) decides which of these to call; it holds the nodes, devices and reservations.

psutil is imported where it is used: Ray vendors it (ray/thirdparty_files, put on sys.path by `import ray`) and
rlplace does not declare it, so it must be imported after ray, which an import sorter would not keep at the top.
"""

from __future__ import annotations

import atexit
import glob
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import TYPE_CHECKING, Any

import ray
import ray._private.ray_constants as ray_constants
import ray._private.services as services
from ray._private.accelerators import get_accelerator_manager_for_resource

from rlplace.scheduler.errors import ClusterError

if TYPE_CHECKING:  # for the annotation only: rlplace.core imports the scheduler, never the other way round
    from rlplace.core.config import ClusterConfig

OWNER_FILE = "rlplace_driver.pid"
"""Written into the session folder of an embedded Ray started here: the driver's pid, so that a later run can tell a
session whose driver was SIGKILLed (nothing stopped its Ray) from a Ray someone else started and stopped."""
REAP_S = 5.0
"""How long `shutdown` waits for the killed leftovers of an embedded Ray to disappear (a process blocked in a system
call dies only when the call returns)."""


def start_local_ray(cfg: ClusterConfig) -> None:
    """Start a single-node Ray for this process only: loopback address, own namespace, quiet logs.

    Ray replaces 127.0.0.1 by the machine's routable IP on Linux unless its cluster mode is off, which is only
    read at start-up; it is switched off for the duration of `ray.init`, so nothing listens for other machines.

    A Ctrl-C or SIGTERM during the start takes effect once Ray is up, and stops it (`_stops_deferred`); one that
    reaches Ray's own SIGTERM handler, which Ray installs part-way through, ends the start, and what it had started
    is removed (`_clean_failed_start`). A start cut short otherwise leaves processes and a session folder that
    nothing identifies as this process's.
    """
    reap_orphaned_sessions()
    enable_cluster = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    with _stops_deferred() as stops:
        try:
            ray.init(
                address="local",
                include_dashboard=cfg.dashboard,
                namespace=cfg.namespace or f"rlplace-{uuid.uuid4().hex[:8]}",
                logging_level=logging.ERROR,
                _node_ip_address="127.0.0.1",
                # Ray starts an idle Python worker per CPU for the first driver, for tasks, whether or not anything
                # takes them. A run starts as many worker processes as its placement names; more only compete with
                # their start.
                _system_config={"prestart_worker_first_driver": False},
            )
        except BaseException as error:
            _clean_failed_start()
            if isinstance(error, Exception):
                raise ClusterError(f"could not start an embedded local Ray: {error}") from error
            raise
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = enable_cluster
        with open(os.path.join(_session_dir(), OWNER_FILE), "w") as f:
            f.write(str(os.getpid()))
    if stops:
        disconnect(stop=True)
        if stops[0] == signal.SIGINT:
            raise KeyboardInterrupt
        sys.exit(128 + stops[0])


@contextmanager
def _stops_deferred() -> Iterator[list[int]]:
    """SIGINT and SIGTERM held back in the block: the signals received, for the caller to act on after it. A handler
    installed meanwhile (Ray's, for SIGTERM) stays. Only the main thread receives signals: elsewhere the block runs
    as it is."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is hold:
                signal.signal(sig, handler)


def _clean_failed_start() -> None:
    """Stop what a `ray.init` that did not finish had started, and delete its session folder, which has no
    `OWNER_FILE` yet: Ray names a session it starts after the starting process (`session_<time>_<pid>`)."""
    leftovers = _ray_processes()
    with suppress(Exception):  # a half-started Ray: stop what can be stopped; the kill below does the rest
        ray.shutdown()
    _kill(leftovers)
    root = ray._common.utils.get_default_ray_temp_dir()
    for session in glob.glob(os.path.join(root, f"session_*_{os.getpid()}")):
        remove_session(session)


def started_here() -> bool:
    """Whether the Ray this process is connected to is an embedded one it started (`start_local_ray`)."""
    session = _session_dir()
    if session is None:
        return False
    try:
        with open(os.path.join(session, OWNER_FILE)) as f:
            return f.read() == str(os.getpid())
    except OSError:
        return False


def reap_orphaned_sessions() -> list[str]:
    """Stop what the embedded Rays of SIGKILLed rlplace drivers left, and delete their session folders; the folders
    reaped.

    A killed driver takes its GCS and raylet with it, but Ray's dashboard and runtime-env agents outlive them,
    re-parented to init, and nothing removes the session folder. Such a session is one whose folder holds
    `OWNER_FILE` naming a process that no longer runs; its leftovers are the processes with a file open in that
    folder (the agents keep their logs open there), which the agents' renamed command lines no longer tell.
    """
    import psutil

    root = ray._common.utils.get_default_ray_temp_dir()
    orphaned = []
    for owner in glob.glob(os.path.join(root, "session_*", OWNER_FILE)):
        try:
            with open(owner) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            continue
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            orphaned.append(os.path.dirname(owner))
    if not orphaned:
        return []
    leftovers = []
    for process in psutil.process_iter():
        try:
            if any(f.path.startswith(tuple(f"{folder}/" for folder in orphaned)) for f in process.open_files()):
                leftovers.append(process)
        except psutil.Error:  # ended meanwhile, or another user's
            continue
    _kill(leftovers)
    for folder in orphaned:
        remove_session(folder)
    return orphaned


def attach(cfg: ClusterConfig) -> None:
    """Connect to the running Ray cluster at `cluster.address` (`head_address`)."""
    address = head_address(cfg)
    try:
        ray.init(address=address, namespace=cfg.namespace, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise ClusterError(f"cluster.address = {cfg.address!r}: could not attach to a Ray cluster: {error}") from error


def head_address(cfg: ClusterConfig) -> str:
    """The address of the Ray head at `cluster.address`, once it answers as one within `cluster.connect_timeout_s`;
    ClusterError naming the address otherwise.

    `ray.init` retries an unreachable head forever, and one where another service answers for half a minute with a
    page of warnings, so the head is first probed (`_wait_for_head`): plain TCP until the deadline, then one gRPC
    handshake, which a Ray head answers and a web server or a database does not.
    """
    try:
        address = services.canonicalize_bootstrap_address(cfg.address)
        if address is None:
            raise ConnectionError("no running Ray cluster found (no RAY_ADDRESS, no cluster started by `ray start`)")
        _wait_for_head(address, cfg.connect_timeout_s)
    except (ConnectionError, ValueError) as error:
        raise ClusterError(f"cluster.address = {cfg.address!r}: could not attach to a Ray cluster: {error}") from error
    return address


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""A gRPC client's first bytes: HTTP/2's connection preface and an empty SETTINGS frame (RFC 9113, 3.4)."""
HTTP2_SETTINGS = 4
"""The type of the frame a gRPC server (Ray's GCS) sends first, in the 4th byte of its 9-byte frame header."""


def _wait_for_head(address: str, timeout: float) -> None:
    """Return once `host:port` accepts a TCP connection and answers HTTP/2 as a gRPC server (Ray's GCS) does;
    ConnectionError after `timeout` seconds of trying, or at once when something else answers there."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(
                (host.strip("[]"), int(port)), timeout=max(0.1, deadline - time.monotonic())
            )
            break
        except OSError as error:
            if time.monotonic() >= deadline:
                raise ConnectionError(
                    f"tried {address} for {timeout:g} s (cluster.connect_timeout_s): {error.strerror or error}"
                ) from error
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    not_ray = (
        f"{address} answers, but not as a Ray head (valid: the head's GCS port, 6379 unless `ray start` chose another)"
    )
    with sock:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock.sendall(HTTP2_PREFACE)
            reply = sock.recv(9)
        except TimeoutError:
            raise ConnectionError(f"{not_ray}: no reply within {timeout:g} s (cluster.connect_timeout_s)") from None
        except OSError as error:
            raise ConnectionError(f"{not_ray}: {error.strerror or error}") from error
    if len(reply) < 4 or reply[3] != HTTP2_SETTINGS:
        raise ConnectionError(f"{not_ray}: it replied {reply!r} to a gRPC handshake")


def local_gpus() -> int:
    """The NVIDIA GPUs Ray would find on this machine (honouring CUDA_VISIBLE_DEVICES), without starting Ray."""
    manager = get_accelerator_manager_for_resource("GPU")
    visible = manager.get_current_process_visible_accelerator_ids()
    found = manager.get_current_node_num_accelerators()
    return found if visible is None else min(found, len(visible))


def disconnect(stop: bool) -> None:
    """`ray.shutdown()`; when this process started Ray (`stop`), none of its processes is left afterwards, nor its
    session folder."""
    if not stop:
        ray.shutdown()
        return
    leftovers = _ray_processes()
    session = _session_dir()
    _kill_monitor()
    ray.shutdown()
    _kill(leftovers)
    if session is not None:
        remove_session(session)


def stop_at_exit_if_started_elsewhere() -> None:
    """When this process started the Ray it is connected to other than through `start_local_ray` (Hydra's Ray
    launcher starts one in the multirun's process), stop it at exit as `start_local_ray`'s is stopped: Ray's own
    exit hook leaves the session folder, and the agents' children, behind."""
    node = ray._private.worker.global_worker.node if ray.is_initialized() else None
    if node is not None and node.head and not started_here():
        atexit.register(disconnect, stop=True)  # runs before Ray's own hook, registered earlier, at ray.init


def _kill_monitor() -> None:
    """Kill the autoscaler monitor of the Ray started here before `ray.shutdown()` stops the rest. Ray stops its GCS
    first, and the monitor then keeps reporting its own termination to the gone GCS until Ray kills it, which delays
    the shutdown; a single-node Ray has nothing for it to scale or clean up."""
    node = ray._private.worker.global_worker.node
    if node is not None:
        node.kill_monitor(check_alive=False)


def _ray_processes() -> list[Any]:
    """The Ray processes this process started (GCS, raylet, agents) and their children (the workers)."""
    import psutil  # Ray vendors psutil in ray/thirdparty_files, which `import ray` puts on sys.path

    ray_dir = os.path.dirname(ray.__file__)
    found = []
    for child in psutil.Process().children():
        try:
            if any(ray_dir in part for part in child.cmdline()):
                found += [child, *child.children(recursive=True)]
        except psutil.Error:
            continue
    return found


def _session_dir() -> str | None:
    """The folder of the Ray session this process started (logs, sockets), while it runs."""
    node = ray._private.worker.global_worker.node
    return None if node is None else node.get_session_dir_path()


def remove_session(session: str) -> None:
    """Delete a stopped session's folder, and Ray's `session_latest` link when it points there: Ray keeps every
    session's folder under the temp dir forever, a few hundred KB per run."""
    shutil.rmtree(session, ignore_errors=True)
    latest = os.path.join(os.path.dirname(session), "session_latest")
    if os.path.islink(latest) and os.path.realpath(latest) == os.path.realpath(session):
        os.unlink(latest)


def _kill(processes: list[Any]) -> None:
    """Kill at once those of `processes` (psutil.Process) still alive after `ray.shutdown()`, and wait until they
    are dead.

    `ray.shutdown()` has given Ray's own processes their graceful exit already. What outlives it are worker
    processes whose actors were terminated and killed through Ray, and their children: such a worker has nothing
    left to do but tear down its interpreter, which can take seconds with torch loaded on a busy machine, and Ray's
    kill does not interrupt that once the actor exited gracefully. No grace period is left to wait for.
    """
    import psutil

    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    deadline = time.monotonic() + REAP_S
    while any(_alive(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.01)


def _alive(process: Any) -> bool:
    """Whether a psutil.Process still runs. A zombie does not: it is dead and waits only for its parent (often the
    init process, once Ray's raylet is gone) to collect its exit status, which some init processes do every second
    or so."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
