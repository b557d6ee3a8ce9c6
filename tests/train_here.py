"""`rlplace-train` run in the pytest process: its entry point, with `sys.argv` as the command line sets it.

A command-line run in a subprocess pays for a Python with torch, Ray's own processes and new worker processes; here
the run joins the Ray this process is connected to, and takes over the devices and worker processes that the
process's last run parked (`scheduler/parking.py`). What only a process of its own shows (exit codes through the
shell, signals, a Ray of its own started and stopped, nothing left behind) stays with the subprocess tests:
tests/test_bad_input.py, tests/faults/, tests/scheduler/test_scheduler_teardown.py, tests/test_wheel.py and
tests/test_report.py's Ray launcher.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from dataclasses import dataclass

import pytest
from hydra.core.global_hydra import GlobalHydra

from rlplace import train


@dataclass(frozen=True)
class Output:
    """What the command wrote (Hydra's console logging goes to stdout)."""

    stdout: str
    stderr: str


def train_here(*argv: str, env: dict[str, str] | None = None) -> Output:
    """Run `rlplace-train *argv` here, with `env` added to the environment; a non-zero exit fails the test.

    Hydra sets up logging for each job (the root logger's handlers, one writing the run's train.log); they are closed
    and the root logger put back as it was, so that later tests log as before.
    """
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stdout, stderr = io.StringIO(), io.StringIO()
    GlobalHydra.instance().clear()
    with (
        pytest.MonkeyPatch.context() as patch,
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        patch.setattr(sys, "argv", ["rlplace-train", *argv])
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        try:
            train.main()
        except SystemExit as exit_info:
            code = exit_info.code
        else:
            code = 0
        finally:
            GlobalHydra.instance().clear()
            for handler in root.handlers:
                if handler not in handlers:
                    handler.close()
            root.handlers[:] = handlers
            root.setLevel(level)
    output = Output(stdout.getvalue(), stderr.getvalue())
    assert code in (0, None), f"rlplace-train exited {code}:\n{output.stdout[-3000:]}\n{output.stderr[-3000:]}"
    return output
