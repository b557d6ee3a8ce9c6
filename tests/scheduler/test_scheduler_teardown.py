"""Ending a driver normally, by an exception, or by Ctrl-C leaves no Ray process behind; what a SIGKILLed driver's
Ray leaves, the next embedded Ray's start reaps.

Each driver runs in its own subprocess with its own embedded Ray, so this test process's Ray is not involved (it is
shut down first, leaving the machine to the drivers); the four run at once to share the start-up time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray  # also puts Ray's vendored psutil on sys.path

from rlplace.core.config import ClusterConfig
from rlplace.scheduler.session import REAP_S, reap_orphaned_sessions, start_local_ray

ROOT = Path(__file__).resolve().parents[2]
MODES = ("exit", "error", "interrupt")
DRIVERS = (*MODES, "kill")


@pytest.fixture(scope="module")
def drivers(no_ray: None) -> Iterator[dict[str, subprocess.Popen[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    script = str(Path(__file__).with_name("driver_script.py"))
    running = {
        mode: subprocess.Popen(
            [sys.executable, script, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        for mode in DRIVERS
    }
    yield running
    for process in running.values():
        if process.poll() is None:
            process.kill()


def alive(processes: list[tuple[int, float]]) -> list[int]:
    """The pids among `processes` (pid, create time) still running: not gone, not a zombie, not a reused pid."""
    import psutil

    running = []
    for pid, created in processes:
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            continue
    return running


@pytest.mark.parametrize("mode", MODES)
def test_driver_end_leaves_no_ray_process(drivers: dict[str, subprocess.Popen[str]], mode: str) -> None:
    driver = drivers[mode]
    started = json.loads(driver.stdout.readline() or "[]")
    assert started, driver.stderr.read()
    if mode == "interrupt":
        time.sleep(0.5)  # let it block in wait()
        driver.send_signal(signal.SIGINT)
    try:
        _, stderr = driver.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        driver.send_signal(signal.SIGABRT)  # with faulthandler on (as `make test` runs), its stacks go to stderr
        _, stderr = driver.communicate(timeout=30)
        pytest.fail(f"the {mode} driver did not end within 60 s; its stacks:\n{stderr[-6000:]}")
    expected = {"exit": "", "error": "RuntimeError: the driver failed", "interrupt": "KeyboardInterrupt"}[mode]
    assert expected in stderr
    assert (driver.returncode == 0) == (mode == "exit"), stderr
    deadline = time.monotonic() + 10
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(started) == []


def test_what_a_sigkilled_drivers_ray_leaves_is_reaped_when_the_next_ray_starts(
    drivers: dict[str, subprocess.Popen[str]],
) -> None:
    driver = drivers["kill"]
    started = json.loads(driver.stdout.readline() or "[]")
    assert started, driver.stderr.read()
    driver.kill()
    driver.wait()
    (session,) = Path(ray._common.utils.get_default_ray_temp_dir()).glob(f"session_*_{driver.pid}")
    assert str(session) in reap_orphaned_sessions()  # what start_local_ray does first
    assert not session.exists()
    deadline = time.monotonic() + 10  # Ray's dashboard and runtime-env agents would outlive the driver for good
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive(started) == []


def own_ray_leftovers() -> tuple[list[Path], list[int]]:
    """This process's Ray session folders (Ray names them after the starting pid) and its Ray child processes."""
    import psutil

    sessions = list(Path(ray._common.utils.get_default_ray_temp_dir()).glob(f"session_*_{os.getpid()}"))
    ray_dir = os.path.dirname(ray.__file__)
    children = [p.pid for p in psutil.Process().children(recursive=True) if any(ray_dir in a for a in p.cmdline())]
    return sessions, children


@pytest.mark.parametrize("stop", ["ctrl-c during the start", "ray's sigterm handler ending it"])
def test_a_start_cut_short_leaves_no_ray_process_or_session_folder(
    no_ray: None, monkeypatch: pytest.MonkeyPatch, stop: str
) -> None:
    """A Ctrl-C that arrives while Ray starts is held until Ray is up, which then stops; Ray's own SIGTERM handler,
    which Ray installs part-way through its start and which exits, ends the start: what it started is removed."""
    real_init = ray.init

    def interrupted(*args: object, **kwargs: object) -> object:
        started = real_init(*args, **kwargs)  # Ray's processes are up; its start has not returned yet
        if stop == "ctrl-c during the start":
            os.kill(os.getpid(), signal.SIGINT)
            return started
        raise SystemExit(1)  # what Ray's handler raises

    monkeypatch.setattr(ray, "init", interrupted)
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt if stop == "ctrl-c during the start" else SystemExit):
        start_local_ray(ClusterConfig())
    assert not ray.is_initialized() and signal.getsignal(signal.SIGINT) is previous
    deadline = time.monotonic() + REAP_S
    while own_ray_leftovers() != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert own_ray_leftovers() == ([], [])
