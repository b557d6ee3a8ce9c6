"""Run folders are never shared silently, and a run that starts its own Ray says when another one already runs on
this machine. No Ray is started: the default folder is composed, the refusal is taken in-process and by a driver
that stops before Ray, and Ray's session folders and raylets are made up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.cli import compose_run
from rlplace.core.neighbours import describe, other_embedded_rays
from rlplace.train import _CLAIMED, claim_run_folder

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def held_folder(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A run folder that another live process (standing in for a running run) holds."""
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield folder, holder
    holder.kill()
    holder.wait()
    fd = _CLAIMED.pop(folder.absolute(), None)
    if fd is not None:
        os.close(fd)


def test_default_run_folders_of_runs_started_in_the_same_second_differ() -> None:
    first, second = (compose_run([], with_hydra=True).hydra.run.dir for _ in range(2))
    assert first != second
    assert re.search(r"runs/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-\d{6}$", first), first
    assert compose_run(["hydra.run.dir=/tmp/mine"], with_hydra=True).hydra.run.dir == "/tmp/mine"


def test_a_folder_another_live_run_holds_is_refused_and_free_once_it_ends(
    held_folder: tuple[Path, subprocess.Popen[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, holder = held_folder
    with pytest.raises(SystemExit) as exit_info:
        claim_run_folder(folder)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"rlplace: error: hydra.run.dir = '{folder}' is in use by another run that is still running")
    holder.kill()  # the run ends (however: its lock goes with its process) and its folder can be resumed
    holder.wait()
    claim_run_folder(folder)
    claim_run_folder(folder)  # this process holds it already: a later job of the same process may claim it again
    assert folder.absolute() in _CLAIMED


def test_rlplace_train_into_a_folder_another_run_holds_exits_2_before_hydra_writes_there(
    held_folder: tuple[Path, subprocess.Popen[str]],
) -> None:
    folder, _ = held_folder
    command = [sys.executable, "-m", "rlplace.train", "debug=fast", "logger=jsonl", f"hydra.run.dir={folder}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "is in use by another run that is still running" in done.stderr
    assert not (folder / ".hydra").exists()  # the running run's record is untouched


SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def started(command: list[str]) -> subprocess.Popen[bytes]:
    """`command` started and past its exec: until then /proc shows the parent's command line for it, which a
    loaded machine made last long enough for a scan to miss the process."""
    process = subprocess.Popen(command)
    wanted = "\0".join(command).encode()
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(wanted) and time.monotonic() < deadline:
        time.sleep(0.01)
    return process


def fake_session(temp_dir: Path, pid: int) -> Path:
    """A Ray session folder as `ray.init` leaves it, named after the process that started it."""
    folder = temp_dir / f"session_2030-01-02_03-04-05_678901_{pid}"
    (folder / "sockets").mkdir(parents=True)
    return folder


def test_another_live_embedded_ray_is_named_in_one_line(tmp_path: Path) -> None:
    other_run = started([*SLEEP, "rlplace-train"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sessions = [
        fake_session(tmp_path, other_run.pid),
        fake_session(tmp_path, os.getpid()),  # this run's own Ray
        fake_session(tmp_path, os.getppid()),  # an ancestor's: the Ray a Hydra Ray launcher job runs in
        fake_session(tmp_path, dead.pid),  # a SIGKILLed driver's leftover folder
    ]
    (tmp_path / "session_latest").symlink_to(sessions[0])
    raylets = [started([*SLEEP, f"--raylet_socket_name={folder}/sockets/raylet"]) for folder in sessions]
    try:
        found = other_embedded_rays(tmp_path)
        assert [(s.pid, s.by_rlplace) for s in found] == [(other_run.pid, True)]
        line = describe(found)
        assert line is not None and "\n" not in line
        assert line.startswith(f"rlplace: 1 other rlplace run (pid {other_run.pid}) already runs an embedded Ray")
        assert describe([]) is None
        raylets[0].kill()  # its Ray is gone (the driver lives on): no longer a Ray that takes the cores
        raylets[0].wait()
        assert other_embedded_rays(tmp_path) == []
    finally:
        for process in [other_run, *raylets]:
            process.kill()
            process.wait()
