"""The calls a turn makes outside the model (tool calls, interaction replies), run concurrently, each with a deadline.

A tool answering over the network or from a sandbox (a search engine, a code runner) takes a round trip per call; one
at a time, a turn of 256 rows would wait for 256 of them, so a turn's calls run at once, as verl's agent loop and
OpenRLHF's agent functions run theirs (on an event loop there; on threads here, so that a tool stays a plain
function). A call that raises, or has not returned by its deadline, gives an error instead of a value, and the run
goes on; a call that hangs is left to its daemon thread, which never holds up the process's exit. Each call is a
function of its arguments, so which call finishes first changes nothing: every outcome is returned in call order.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """What a call gave: its value, or the error it raised (a TimeoutError when it missed its deadline)."""

    value: Any = None
    error: BaseException | None = None

    @property
    def message(self) -> str:
        """The error in one line, as the model reads it (`ValueError: ...`)."""
        assert self.error is not None
        return f"{type(self.error).__name__}: {self.error}" if str(self.error) else type(self.error).__name__


def run_calls(calls: Sequence[Callable[[], Any]], concurrency: int, timeout_s: float) -> list[Outcome]:
    """Run `calls`, at most `concurrency` at a time, each on a daemon thread of its own and given `timeout_s` from
    its start; their outcomes in call order. A call past its deadline frees its slot for the next one."""
    outcomes: list[Outcome] = [Outcome()] * len(calls)
    waiting = deque(enumerate(calls))
    running: dict[Future, tuple[int, float]] = {}
    while waiting or running:
        while waiting and len(running) < concurrency:
            index, call = waiting.popleft()
            running[_started(call)] = (index, time.monotonic() + timeout_s)
        first_deadline = min(deadline for _, deadline in running.values())
        wait(running, timeout=max(0.0, first_deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        now = time.monotonic()
        for future, (index, deadline) in list(running.items()):
            if future.done():
                error = future.exception()
                outcomes[index] = Outcome(error=error) if error is not None else Outcome(future.result())
            elif now >= deadline:
                outcomes[index] = Outcome(error=TimeoutError(f"no answer within {timeout_s:g} s"))
            else:
                continue
            del running[future]
    return outcomes


def _started(call: Callable[[], Any]) -> Future:
    """`call` running on a daemon thread; its future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as error:  # SystemExit included: the caller gets an outcome either way
            future.set_exception(error)

    threading.Thread(target=run, name="rlplace-call", daemon=True).start()
    return future
