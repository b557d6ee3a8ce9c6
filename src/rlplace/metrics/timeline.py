"""The device timeline: who was busy on which device, and when.

Placement's cost shows up as idle devices and as phases that do or do not overlap. Every timed piece of work is a
span (`name`, `group`, `rank`, unix `start`/`end`): workers record them with the scheduler's `@timer` and
`Worker.span`, the driver with `PhaseTimer`. Knowing which devices each (group, rank) process holds turns spans into
per-device rows, from which this module derives `util/device_<i>/busy_frac`, the overlap of two groups (proof that
pipelining happens), and a Chrome trace (`timeline.json`) to look at in chrome://tracing or https://ui.perfetto.dev.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

HOST_PID = 1 << 20
"""Trace row (pid) for processes without devices: the driver, node-group (CPU-only) workers."""

_SPAN_KEYS = ("name", "group", "rank", "start", "end")

Interval = tuple[float, float]


class Span(TypedDict):
    """One timed piece of work by one process; `start`/`end` are unix seconds so all processes share one axis.

    The one record of timed work in rlplace: what workers hand over from `pop_timings`, what `PhaseTimer` keeps,
    what the timeline reads. A duration is `end - start`, never stored, so it cannot disagree with them.
    """

    name: str
    group: str
    rank: int
    start: float
    end: float


def merge_intervals(intervals: Iterable[Interval], t0: float, t1: float) -> list[Interval]:
    """The union of `intervals` clipped to [t0, t1], as sorted disjoint intervals."""
    clipped = sorted((max(s, t0), min(e, t1)) for s, e in intervals if e > t0 and s < t1)
    merged: list[Interval] = []
    for start, end in clipped:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def total_length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersection_length(a: Sequence[Interval], b: Sequence[Interval]) -> float:
    """Length of the intersection of two sorted, disjoint interval lists (a two-pointer sweep)."""
    i = j = 0
    length = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            length += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return length


def _check_window(t0: float, t1: float) -> None:
    if t1 <= t0:
        raise ValueError(f"time window must have t1 > t0, got [{t0!r}, {t1!r}]")


def _check_span(span: Mapping[str, Any]) -> Span:
    missing = [key for key in _SPAN_KEYS if key not in span]
    if missing:
        raise ValueError(f"span {dict(span)!r} lacks {missing}; a span needs {list(_SPAN_KEYS)}")
    start, end = float(span["start"]), float(span["end"])
    if end < start:
        raise ValueError(f"span {dict(span)!r} ends before it starts")
    return Span(name=str(span["name"]), group=str(span["group"]), rank=int(span["rank"]), start=start, end=end)


class Timeline:
    """Span records of a whole run, mapped onto devices.

    `devices` maps each `(group, rank)` process to the global device ranks it holds; processes that hold none
    (node-group workers, the driver) or are not in the mapping land on the "host" row and count toward no device.
    `num_devices` is the run's device budget, so devices nobody uses still appear (idle) in the trace and in
    `utilization()`. `start` is the run's start in unix seconds (trace timestamps are relative to it; defaults to
    now). Spans are appended across steps; `write()` rewrites the whole trace atomically, cheap enough every step.
    """

    def __init__(
        self,
        devices: Mapping[tuple[str, int], Sequence[int]],
        *,
        num_devices: int | None = None,
        start: float | None = None,
    ) -> None:
        self._devices: dict[tuple[str, int], tuple[int, ...]] = {
            (str(group), int(rank)): tuple(int(d) for d in devs) for (group, rank), devs in devices.items()
        }
        used = {d for devs in self._devices.values() for d in devs}
        if num_devices is not None and used and max(used) >= num_devices:
            raise ValueError(f"device {max(used)} is outside the run's num_devices={num_devices}")
        self.device_ids: list[int] = sorted(used | set(range(num_devices or 0)))
        self.start = time.time() if start is None else float(start)
        self._spans: list[Span] = []
        self._by_device: dict[int, list[Interval]] = {d: [] for d in self.device_ids}
        self._by_group: dict[str, list[Interval]] = {}

    @property
    def spans(self) -> list[Span]:
        return list(self._spans)

    def devices_of(self, group: str, rank: int) -> tuple[int, ...]:
        return self._devices.get((group, rank), ())

    def add(self, span: Mapping[str, Any]) -> None:
        record = _check_span(span)
        self._spans.append(record)
        interval = (record["start"], record["end"])
        for device in self.devices_of(record["group"], record["rank"]):
            self._by_device[device].append(interval)
        self._by_group.setdefault(record["group"], []).append(interval)

    def extend(self, spans: Iterable[Mapping[str, Any]]) -> None:
        for span in spans:
            self.add(span)

    def busy_frac(self, device: int, t0: float, t1: float) -> float:
        """Fraction of [t0, t1] during which anything ran on `device`; overlapping spans count once."""
        _check_window(t0, t1)
        if device not in self._by_device:
            raise ValueError(f"unknown device {device}; the timeline knows devices {self.device_ids}")
        return total_length(merge_intervals(self._by_device[device], t0, t1)) / (t1 - t0)

    def utilization(self, t0: float, t1: float) -> dict[str, float]:
        """`util/device_<i>/busy_frac` for every device of the run over [t0, t1]."""
        return {f"util/device_{d}/busy_frac": self.busy_frac(d, t0, t1) for d in self.device_ids}

    def busy_seconds(self, group: str, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which at least one rank of `group` was busy."""
        _check_window(t0, t1)
        return total_length(merge_intervals(self._by_group.get(group, []), t0, t1))

    def overlap(self, group_a: str, group_b: str, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which both groups were busy (any rank of each): > 0 means they pipelined."""
        _check_window(t0, t1)
        a = merge_intervals(self._by_group.get(group_a, []), t0, t1)
        b = merge_intervals(self._by_group.get(group_b, []), t0, t1)
        return intersection_length(a, b)

    def to_chrome_trace(self) -> dict[str, Any]:
        """The Chrome trace-event document: one process row per device (plus "host"), one thread per process.

        A span of a process holding several devices appears on each of their rows. Thread ids are unique per
        (row, group, rank): Perfetto's JSON importer treats a tid seen under a new pid as a new thread.
        """
        events: list[dict[str, Any]] = []
        for sort_index, device in enumerate(self.device_ids):
            events.append(_meta("process_name", device, 0, {"name": f"device {device}"}))
            events.append(_meta("process_sort_index", device, 0, {"sort_index": sort_index}))
        tids: dict[tuple[int, str, int], int] = {}
        for span in self._spans:
            group, rank = span["group"], span["rank"]
            devices = self.devices_of(group, rank)
            for pid in devices or (HOST_PID,):
                key = (pid, group, rank)
                if key not in tids:
                    tids[key] = len(tids) + 1
                    events.append(_meta("thread_name", pid, tids[key], {"name": f"{group} rank {rank}"}))
                    events.append(_meta("thread_sort_index", pid, tids[key], {"sort_index": tids[key]}))
                events.append(
                    {
                        "name": span["name"],
                        "cat": group,
                        "ph": "X",
                        "ts": (span["start"] - self.start) * 1e6,
                        "dur": (span["end"] - span["start"]) * 1e6,
                        "pid": pid,
                        "tid": tids[key],
                        "args": {"group": group, "rank": rank, "devices": list(devices)},
                    }
                )
        if any(pid == HOST_PID for pid, _, _ in tids):
            events.append(_meta("process_name", HOST_PID, 0, {"name": "host"}))
            events.append(_meta("process_sort_index", HOST_PID, 0, {"sort_index": len(self.device_ids)}))
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_start_unix_s": self.start}}

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome trace to `path` atomically (temp file + os.replace), so a reader never sees half."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_chrome_trace(), f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
