"""What a worker process must know before any user code runs, carried in its environment.

The driver cannot run code in an actor's process before the actor's class is instantiated, but Ray starts each
actor's process with the environment of its runtime_env. So the driver writes everything a worker needs into
environment variables: the torch.distributed conventions (RANK, MASTER_ADDR, ...), CUDA_VISIBLE_DEVICES, and one
JSON variable with the full `WorkerContext`, which `Worker.__new__` reads to pin the process before `__init__`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from rlplace.placement.placement import Placement

PINNED_REGISTER = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
"""torch's host allocator setting that pins memory by registering a plain allocation from 8 threads instead of one
cudaHostAlloc, several times faster for a model's first offload (benchmarks/gpu_suite.py, offload section); later
offloads copy into the memory the first one pinned (`core.offload.HostCopies`)."""

CONTEXT_ENV_VAR = "RLPLACE_WORKER_CONTEXT"
"""Holds the JSON `WorkerContext`; only processes started by `WorkerGroupSpec.launch` have it."""


@dataclass(frozen=True)
class WorkerContext:
    """One worker's identity and resources: its group, its placement, and the CPU cores it owns."""

    group_name: str
    group_uid: str
    """The group's name plus a per-launch suffix, so a relaunched group never meets its predecessor's state."""
    placement: Placement
    device_type: str
    cores: tuple[int, ...]
    """CPU cores of the worker's logical devices on a cpu cluster; empty when the process is not pinned."""
    rendezvous: str
    """Hub address of the object that introduces communicating workers to each other (rendezvous.py)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerContext:
        fields = json.loads(text)
        placement = fields.pop("placement")
        for name in ("devices", "local_devices"):
            placement[name] = tuple(placement[name])
        return cls(placement=Placement(**placement), cores=tuple(fields.pop("cores")), **fields)

    @classmethod
    def from_env(cls) -> WorkerContext | None:
        text = os.environ.get(CONTEXT_ENV_VAR)
        return None if text is None else cls.from_json(text)


def worker_env(context: WorkerContext, master_addr: str, master_port: int) -> dict[str, str]:
    """The environment of one worker process.

    On a gpu cluster CUDA_VISIBLE_DEVICES lists the worker's local GPUs, and Ray is told not to overwrite it (Ray
    would set the GPU it picked for the worker's share of the reservation, which need not be the placed one). On a
    cpu cluster the logical devices are not CUDA devices, so CUDA_VISIBLE_DEVICES is empty (a CPU-placement run on a
    GPU machine must not use the GPUs); their ids are in RLPLACE_LOCAL_DEVICES on both kinds of cluster. A gpu
    worker's host allocator pins from several threads (`PINNED_REGISTER`), which makes its first offload faster.
    """
    placement = context.placement
    local_devices = ",".join(str(d) for d in placement.local_devices)
    env = {
        CONTEXT_ENV_VAR: context.to_json(),
        "RANK": str(placement.rank),
        "WORLD_SIZE": str(placement.world_size),
        "LOCAL_RANK": str(placement.local_rank),
        "LOCAL_WORLD_SIZE": str(placement.local_world_size),
        "NODE_RANK": str(placement.node_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RLPLACE_LOCAL_DEVICES": local_devices,
        "CUDA_VISIBLE_DEVICES": local_devices if context.device_type == "gpu" else "",
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    }
    if context.cores:
        env["OMP_NUM_THREADS"] = str(len(context.cores))
    if context.device_type == "gpu":
        env["PYTORCH_CUDA_ALLOC_CONF"] = cuda_alloc_conf(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    return env


def cuda_alloc_conf(current: str | None) -> str:
    """The driver's PYTORCH_CUDA_ALLOC_CONF with `PINNED_REGISTER` added, unless it already says how to pin."""
    if not current:
        return PINNED_REGISTER
    return current if "pinned_" in current else f"{current},{PINNED_REGISTER}"
