"""Faults a run must report or survive, each bounded in time: bad input and unwritable outputs, an unreachable
cluster, damaged checkpoints, a hung or killed worker, preemption by SIGTERM.

What the command line does is checked in a subprocess where only the command line can show it (exit codes, the
preemption path); the rest runs in this process, against one embedded Ray the module's runs share.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray

from rlplace.cli import check_overrides, compose_run
from rlplace.core import checkpoint
from rlplace.core.errors import ConfigError
from rlplace.families import resolve
from rlplace.scheduler import WorkerError, WorkerTimeout
from rlplace.scheduler.group import GRACEFUL_EXIT_S
from rlplace.scheduler.hosts import ACTOR_NAME_TOKEN
from rlplace.scheduler.session import REAP_S
from rlplace.train import RUN_INFO, train
from tests import TEST_PRESETS
from tests.ray_temp import RAY_TEMP

TINY = ["task.total_num_envs=4", "rollout.num_steps=16", "algorithm.num_minibatches=2", "logger=jsonl"]
TINY.append("cluster.component_placement.actor=0")  # one actor process: 3 worker processes to start, not 4


def rlplace_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rlplace.train", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["placement=foo"], "Could not find 'placement/foo' Available options in 'placement': auto"),
        (
            ["runner.max_steps=abc"],
            "override runner.max_steps=abc: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (["runner.max_stepz=3"], "Could not override 'runner.max_stepz'"),
        (["-m", "placement=collocated,fooo"], "Could not find 'placement/fooo'"),
        (["runner.max_steps=["], "no viable alternative at input '['"),
        (["~logger"], "~logger: a config group cannot be removed, choose one of its options (logger=jsonl|none|wandb)"),
    ],
)
def test_composition_errors_exit_2_with_one_line(capsys, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        check_overrides(args)
    assert exit_info.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rlplace: error: ") and message in line


def test_an_output_folder_that_cannot_be_written_exits_2_naming_it(capsys, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        check_overrides([f"hydra.run.dir={blocker}/run"])
    assert exit_info.value.code == 2
    assert f"hydra.run.dir = '{blocker}/run': cannot write the run's outputs there" in one_line(capsys.readouterr().err)


def test_a_multirun_in_which_every_job_is_skipped_exits_2(tmp_path: Path) -> None:
    result = rlplace_train(
        "-m", "cluster.num_devices_per_node=1", "placement=hybrid,disaggregated", f"hydra.sweep.dir={tmp_path}"
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"rlplace: error: every job of the multirun in {tmp_path} was skipped" in result.stderr
    assert len(list(tmp_path.glob("*/skipped.txt"))) == 2


def test_an_unreachable_cluster_exits_2_naming_the_address_without_hanging(tmp_path: Path) -> None:
    start = time.monotonic()
    result = rlplace_train(
        *TINY, "cluster.address=127.0.0.1:1", "cluster.connect_timeout_s=2", f"hydra.run.dir={tmp_path}"
    )
    assert result.returncode == 2, result.stderr[-2000:]
    line = one_line(result.stderr)
    assert line.startswith("rlplace: error: cluster.address = '127.0.0.1:1': could not attach to a Ray cluster: tried")
    assert "for 2 s (cluster.connect_timeout_s)" in line
    assert time.monotonic() - start < 60
    assert not (tmp_path / RUN_INFO).exists()


def _checkpoint(root: Path) -> Path:
    tmp = checkpoint.staging_dir(root, 1)
    (tmp / "actor.pt").write_bytes(b"\0" * 64)
    (tmp / "runner.json").write_text(json.dumps({"step": 1}))
    return checkpoint.commit(tmp)


def _once_training(run_dir: Path, name: str, action, ended: threading.Event | None = None) -> threading.Thread:
    """Once the run has logged a step, apply `action(pid)` to a process of this process's Ray that hosts a worker of
    class `name` (`_hosting`); nothing once `ended` is set (the run is over)."""
    ended = threading.Event() if ended is None else ended

    def watch() -> None:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
            if ended.wait(0.1):
                return
        while time.monotonic() < deadline and not ended.is_set():  # until its log names it
            children = {process.pid for process in psutil.Process().children(recursive=True)}
            hosting = [pid for pid in _hosting(name) if pid in children]
            if hosting:
                action(hosting[0])
                return
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _hosting(name: str) -> list[int]:
    """The pids of this Ray's worker processes whose current worker is of class `name`: the last name each printed to
    its log (`Host._take_name`). A process's title will not do: a process kept from an earlier run shows, during a
    call, the class it started as."""
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    found = []
    for log in logs.glob("worker-*.out"):
        names = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(ACTOR_NAME_TOKEN)]
        if names and names[-1].removeprefix(ACTOR_NAME_TOKEN).split(" ")[0] == name:
            found.append(int(log.stem.rsplit("-", 1)[1]))
    return found


HANG_TIMEOUT_S = 4
"""runner.hang_timeout_s of the hung-worker test: short, since the test waits it out."""
ATTEMPTS = 3
"""Runs of the hung-worker test at most, each with a deadline HANG_GROWTH times the last one's (see there)."""
HANG_GROWTH = 3


def _stop_process(stopped: list[float]):
    """An action for `_once_training`: stop the process (SIGSTOP) and note when, in `stopped`."""

    def stop(pid: int) -> None:
        stopped.append(time.monotonic())
        os.kill(pid, signal.SIGSTOP)

    return stop


@pytest.mark.slow
def test_a_hung_worker_is_named_within_the_hang_deadline(shared_ray: None, tmp_path: Path) -> None:
    """The env is stopped (SIGSTOP) once a step is logged; the wait on it must name it, its rank and its method.

    The deadline is the larger of runner.hang_timeout_s and 5 x the slowest step, the same for every call. Until the
    first step has set it from a step time, real work can outlast a deadline this short on a loaded machine (the
    first training call, say): that run ends with a WorkerTimeout before the env was stopped, which is the deadline
    doing its job on a slow call, not the hang this test is about; the run is then repeated with a longer deadline.
    A timeout after the stop must name the env."""
    hang_timeout_s = HANG_TIMEOUT_S
    for attempt in range(ATTEMPTS):
        run_dir = tmp_path / str(attempt)
        run_dir.mkdir()
        plan = resolve(compose_run([*TINY, "runner.max_steps=500", f"runner.hang_timeout_s={hang_timeout_s}"]))
        stopped: list[float] = []
        ended = threading.Event()
        watcher = _once_training(run_dir, "EnvWorker", _stop_process(stopped), ended)
        with pytest.raises(WorkerTimeout) as timed_out:
            train(plan, run_dir, {})
        hung = bool(stopped)  # whether the env was stopped before the timeout
        ended.set()
        watcher.join()
        if hung:
            break
        assert attempt + 1 < ATTEMPTS, f"every run timed out before its env was stopped: {timed_out.value}"
        hang_timeout_s *= HANG_GROWTH
    message = r"group 'env' rank \d: \w+\(\) did not finish within [\d.]+ s \(hung.*; its process is stopped\)"
    assert re.fullmatch(message, str(timed_out.value)), str(timed_out.value)
    # The deadline is hang_timeout_s, or 5 x the slowest step when that is longer (a busy machine): reported within
    # twice that, plus the teardown (the stopped worker's graceful period, then its kill).
    teardown = GRACEFUL_EXIT_S + REAP_S
    deadline = max(hang_timeout_s, 5 * max_step(run_dir))
    assert time.monotonic() - stopped[0] < 2 * deadline + teardown


def max_step(run_dir: Path) -> float:
    return max(json.loads(line)["time/step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_a_killed_worker_is_named_at_once(shared_ray: None, tmp_path: Path) -> None:
    plan = resolve(compose_run([*TINY, "runner.max_steps=500"]))
    watcher = _once_training(tmp_path, "RolloutWorker", lambda pid: os.kill(pid, signal.SIGKILL))
    with pytest.raises(WorkerError, match=r"group 'rollout' rank \d: \w+\(\) failed: the worker process died"):
        train(plan, tmp_path, {})
    watcher.join()


# The run re-places itself after 2 steps (into the tests' own preset: env, rollout and actor on device 0), and the
# signal comes as that switch begins (the second metrics row is the step before it): the switch, its checkpoint
# included, is no place to stop, so the run finishes it and the step after it, and exits resumable.
SWITCH = [TEST_PRESETS, "runner.replace_at=[2:one_device]"]


@pytest.mark.slow
def test_sigterm_in_a_switch_finishes_a_step_writes_a_checkpoint_and_leaves_nothing_behind(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "rlplace.train", *TINY, *SWITCH, "runner.max_steps=500"]
    command.append(f"hydra.run.dir={tmp_path}")
    started = time.time()
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    processes = psutil.Process(driver.pid).children(recursive=True)
    # Ray names a session after the process that started it; a folder of an earlier process with the same pid (pids
    # are reused on a long-lived machine) is older than this driver.
    session = [p for p in RAY_TEMP.glob(f"session_*_{driver.pid}") if p.stat().st_mtime >= started]
    assert len(session) == 1
    driver.send_signal(signal.SIGTERM)
    out, err = driver.communicate(timeout=120)
    assert driver.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "rlplace: SIGTERM received: finishing this step, writing a checkpoint" in err
    assert "rlplace: stopped by SIGTERM" in out
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    saved = checkpoint.latest(tmp_path / checkpoint.FOLDER)
    assert saved is not None and checkpoint.step_of(saved) == len(rows) < 500
    checkpoint.verify(saved)
    (replaced,) = json.loads((tmp_path / RUN_INFO).read_text())["replaced"]
    assert replaced["step"] == 2 and len(rows) == 3  # the switch was made, and one step after it
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not session[0].exists()


# Last in the module: the shared Ray stops for them (`no_ray`), after the runs above have used it.
def test_a_damaged_checkpoint_is_refused_before_anything_starts(no_ray: None, tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "old" / checkpoint.FOLDER)
    with (folder / "actor.pt").open("r+b") as file:
        file.truncate(10)
    with pytest.raises(ConfigError, match=r"actor.pt has 10 bytes, the manifest says 64 \(truncated\?\)"):
        train(resolve(compose_run([*TINY, f"runner.resume={folder}"])), tmp_path / "run", {})
    assert not ray.is_initialized()


def test_resume_auto_with_nothing_to_resume_is_refused_unless_asked_to_start_fresh(
    no_ray: None, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="runner.resume = 'auto': no checkpoint under"):
        train(resolve(compose_run([*TINY, "runner.resume=auto"])), tmp_path, {})
    assert not ray.is_initialized()
