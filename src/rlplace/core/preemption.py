"""Preemption: SIGTERM or a first Ctrl-C ends a run after the current step, with a checkpoint, instead of mid-step.

Batch schedulers (Slurm, Kubernetes) send SIGTERM and wait a grace period before SIGKILL; a user presses Ctrl-C. In
both cases the step under way is finished and saved so the run resumes (`runner.resume=auto`) where it stopped. The
driver installs the handlers for the length of a run (`handled`, after Ray has put in its own SIGTERM handler, which
would exit at once); the runners ask `requested()` between steps. Before the first step (pretraining a model, the
workers starting) there is nothing to save: that work asks `stop_if_requested()`, and the run ends there. A second
Ctrl-C aborts at once.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_received: list[int] = []
"""The signals received during the current `handled` block."""


def requested() -> bool:
    """True once a stop was asked for: the loop should save a checkpoint after this step and end."""
    return bool(_received)


def received() -> int | None:
    """The signal that asked the run to stop, if any."""
    return _received[0] if _received else None


class StoppedEarly(Exception):
    """A stop asked for before the run's first step: nothing was trained, so there is nothing to save."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name} before the first step: nothing to save")
        self.signum = signum


def stop_if_requested() -> None:
    """Raise StoppedEarly once a stop was asked for: for the work before a run's first step, which has no step to
    finish (pretraining, starting the workers)."""
    if _received:
        raise StoppedEarly(_received[0])


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _received and signum == signal.SIGINT:
        raise KeyboardInterrupt  # the second Ctrl-C: stop waiting for the step
    if not _received:
        name = signal.Signals(signum).name
        print(
            f"rlplace: {name} received: finishing this step, writing a checkpoint, then stopping; before the first "
            "step, stopping at once (Ctrl-C again aborts at once)",
            file=sys.stderr,
            flush=True,
        )
    _received.append(signum)


@contextmanager
def handled() -> Iterator[None]:
    """Route SIGTERM and SIGINT to `requested()` inside the block; the previous handlers come back after it."""
    _received.clear()
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
