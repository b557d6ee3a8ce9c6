"""A driver run in a subprocess by test_scheduler_teardown: it prints the processes its Ray started, then ends the
way argv[1] says (`exit`, `error`, or `interrupt` and `kill`: blocking until the test sends SIGINT or SIGKILL)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import ray

from rlplace.core.config import ClusterConfig
from rlplace.scheduler import Cluster, Worker
from tests.scheduler.helpers import on_devices


class Sleeper(Worker):
    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def main(mode: str) -> None:
    import psutil  # vendored by Ray, importable once ray is

    # Ctrl-C raises KeyboardInterrupt as in a terminal, also when this process inherited SIGINT ignored (started by a
    # shell in the background, as CI scripts may be; Python then installs no handler of its own).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    with Cluster(ClusterConfig()) as cluster:
        group = Sleeper.create_group().launch(cluster, name="sleepers", placement_strategy=on_devices((0,)))
        worker_pids = group.pid().wait()
        started = [(p.pid, p.create_time()) for p in psutil.Process().children(recursive=True)]
        assert set(worker_pids) <= {pid for pid, _ in started}
        print(json.dumps(started), flush=True)
        if mode == "error":
            raise RuntimeError("the driver failed")
        if mode in ("interrupt", "kill"):
            group.sleep(600).wait()
    assert not ray.is_initialized()


if __name__ == "__main__":
    main(sys.argv[1])
