"""The calls a turn makes outside the model (tool calls, interaction replies), run concurrently, each with a deadline.

A tool answering over the network or from a sandbox (a search engine, a code runner) takes a round trip per call; one
at a time, a turn of 256 rows would wait for 256 of them, so a turn's calls run at once, as verl's agent loop and
OpenRLHF's agent functions run theirs (on an event loop there; on threads here, so that a tool stays a plain
function). A call starts as soon as it is handed over, which may be while the engine still decodes the turn's other
rows (`GenerationEngine.generate`'s `on_done`). A call that raises, or has not returned by its deadline when the
turn waits for it, gives an error instead of a value, and the run goes on; a call that hangs is left to its daemon
thread, which never holds up the process's exit. Each call is a function of its arguments, so when a call starts
and which finishes first change nothing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
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


class Calls:
    """Calls run at most `concurrency` at a time, each on a daemon thread of its own, started as they are handed over
    (`start`) or as a slot frees, and given `timeout_s` from their start; `outcomes` waits for them."""

    def __init__(self, concurrency: int, timeout_s: float) -> None:
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._changed = threading.Condition()
        self._queued: deque[tuple[Hashable, Callable[[], Any]]] = deque()
        self._running: dict[Hashable, tuple[object, float]] = {}
        """Each running call's token (what its thread reports with) and deadline."""
        self._finished: dict[Hashable, Outcome] = {}

    def start(self, key: Hashable, call: Callable[[], Any]) -> None:
        """Run `call` as soon as a slot is free; its outcome will be `key`'s."""
        with self._changed:
            self._queued.append((key, call))
            self._fill()

    def outcomes(self) -> dict[Hashable, Outcome]:
        """Wait for every call started since the last `outcomes`, giving up those past their deadline (whose slots
        then go to the calls queued); each call's outcome by key."""
        with self._changed:
            while self._queued or self._running:
                now = time.monotonic()
                for key, (_, deadline) in list(self._running.items()):
                    if now >= deadline:
                        del self._running[key]
                        self._finished[key] = Outcome(error=TimeoutError(f"no answer within {self.timeout_s:g} s"))
                self._fill()
                if self._running:
                    first_deadline = min(deadline for _, deadline in self._running.values())
                    self._changed.wait(max(0.0, first_deadline - time.monotonic()))
            finished, self._finished = self._finished, {}
            return finished

    def _fill(self) -> None:
        """Start queued calls while slots are free (the lock held)."""
        while self._queued and len(self._running) < self.concurrency:
            key, call = self._queued.popleft()
            token = object()
            self._running[key] = (token, time.monotonic() + self.timeout_s)
            threading.Thread(target=self._run, args=(key, token, call), name="rlplace-call", daemon=True).start()

    def _run(self, key: Hashable, token: object, call: Callable[[], Any]) -> None:
        try:
            outcome = Outcome(call())
        except BaseException as error:  # SystemExit included: the caller gets an outcome either way
            outcome = Outcome(error=error)
        with self._changed:
            running = self._running.get(key)
            if running is None or running[0] is not token:
                return  # given up at its deadline: its outcome is already the timeout's
            del self._running[key]
            self._finished[key] = outcome
            self._fill()
            self._changed.notify_all()
