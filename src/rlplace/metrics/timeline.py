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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

HOST_PID = 1 << 20
"""Trace row (pid) for processes without devices: the driver, node-group (CPU-only) workers."""

TRACE_MODE = 0o644
"""timeline.json's permissions: readable by whoever reads the run folder, like the run's other files."""

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
    peak_bytes: NotRequired[int]
    """On a CUDA worker: its process's peak allocated device bytes during the span (`DeviceMemory`)."""
    resident_bytes: NotRequired[int]
    """... and what it left allocated at the span's end."""


MEMORY_KEYS = ("peak_bytes", "resident_bytes")
GB = 1e9


def make_span(
    name: str, group: str, rank: int, start: float, seconds: float, memory: tuple[int, int] | None = None
) -> Span:
    span = Span(name=name, group=group, rank=rank, start=start, end=start + seconds)
    if memory is not None:
        span["peak_bytes"], span["resident_bytes"] = memory
    return span


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
    record = Span(name=str(span["name"]), group=str(span["group"]), rank=int(span["rank"]), start=start, end=end)
    if all(key in span for key in MEMORY_KEYS):
        record["peak_bytes"], record["resident_bytes"] = int(span["peak_bytes"]), int(span["resident_bytes"])
    return record


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
        self._devices = _device_map(devices)
        used = {d for devs in self._devices.values() for d in devs}
        if num_devices is not None and used and max(used) >= num_devices:
            raise ValueError(f"device {max(used)} is outside the run's num_devices={num_devices}")
        self.device_ids: list[int] = sorted(used | set(range(num_devices or 0)))
        self.start = time.time() if start is None else float(start)
        self._spans: list[Span] = []
        self._by_device: dict[int, list[Interval]] = {d: [] for d in self.device_ids}
        self._by_group: dict[str, list[Interval]] = {}
        self._by_name: dict[tuple[str, str], list[Interval]] = {}
        """(group, span name) -> its intervals."""
        self._threads: dict[tuple[int, str, int], int] = {}
        """(row, group, rank) -> thread id in the trace."""
        self._events: list[str] = []
        """The spans' trace events, JSON-encoded once as they arrive, so that `write` every step stays cheap."""
        self._memory: dict[tuple[str, int], list[Span]] = {}
        """(group, rank) -> its spans that carry device memory, in the order they arrived."""

    def remap(self, devices: Mapping[tuple[str, int], Sequence[int]], *, num_devices: int | None = None) -> None:
        """Place the spans added from now on by `devices` (a run re-placed between two steps); the spans so far stay
        on the rows they were drawn on. Rows are labelled by the newest placement."""
        self._devices = _device_map(devices)
        used = {d for devs in self._devices.values() for d in devs} | set(range(num_devices or 0))
        self.device_ids = sorted(set(self.device_ids) | used)
        for device in self.device_ids:
            self._by_device.setdefault(device, [])
        self._memory.clear()  # the processes that held device memory are gone

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
        self._by_name.setdefault((record["group"], record["name"]), []).append(interval)
        if "peak_bytes" in record:
            self._memory.setdefault((record["group"], record["rank"]), []).append(record)
        self._events.extend(self._encode_span(record))

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

    def memory(self, t0: float, t1: float, phases: Sequence[str], driver: str = "driver") -> dict[str, float]:
        """`memory/device_<d>/<phase>_gb` for each of the `driver`'s `phases` that ran in [t0, t1]: per device, the
        sum over its CUDA processes of their peak in the spans that overlap the phase, or, for a process idle in it,
        what its last span before the phase left allocated. Nothing without CUDA workers.

        A sum of per-process peaks: two processes peaking at different moments of a phase count as peaking at once,
        which is also how the planner's memory model adds components up (`rlplace.planner.memory`)."""
        found: dict[str, float] = {}
        for phase in phases:
            for start, end in merge_intervals(self._by_name.get((driver, phase), []), t0, t1):
                for device, used in self._device_bytes(start, end).items():
                    key = f"memory/device_{device}/{phase}_gb"
                    found[key] = max(found.get(key, 0.0), used / GB)
        for process, spans in self._memory.items():  # later steps need the spans from t0 on, and the last before
            before = [i for i, span in enumerate(spans) if span["end"] <= t0]
            self._memory[process] = spans[before[-1] :] if before else spans
        return found

    def _device_bytes(self, start: float, end: float) -> dict[int, int]:
        used: dict[int, int] = {}
        for process, spans in self._memory.items():
            held = 0
            for span in reversed(spans):  # the newest first: the window is at most a step back
                if span["end"] <= start:
                    held = max(held, span["resident_bytes"])
                    break
                if span["start"] < end:
                    held = max(held, span["peak_bytes"])
            for device in self.devices_of(*process):
                used[device] = used.get(device, 0) + held
        return used

    def busy_seconds(self, group: str, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which at least one rank of `group` was busy."""
        _check_window(t0, t1)
        return total_length(merge_intervals(self._by_group.get(group, []), t0, t1))

    def overlap(
        self,
        a: str | Sequence[str],
        b: str | Sequence[str],
        t0: float,
        t1: float,
        *,
        spans_of_a: Sequence[str] | None = None,
    ) -> float:
        """Seconds of [t0, t1] during which some rank of group(s) `a` and some rank of group(s) `b` were both busy:
        > 0 means they pipelined (env and rollout), or that training ran beside generation (actor; env, rollout).
        `spans_of_a` counts only those spans of `a` (the actor's training, not its weight sync, which its receivers
        share with it in every placement)."""
        _check_window(t0, t1)
        return intersection_length(self._busy(a, t0, t1, spans_of_a), self._busy(b, t0, t1))

    def _busy(
        self, groups: str | Sequence[str], t0: float, t1: float, spans: Sequence[str] | None = None
    ) -> list[Interval]:
        names = (groups,) if isinstance(groups, str) else groups
        if spans is None:
            intervals = (i for name in names for i in self._by_group.get(name, []))
        else:
            intervals = (i for name in names for span in spans for i in self._by_name.get((name, span), []))
        return merge_intervals(intervals, t0, t1)

    def row_labels(self) -> dict[int, str]:
        """Trace row (pid) -> its name, naming who works there: "device 0: actor, env" (components in the order of
        the device mapping; "idle" if none), and "host: driver, ..." for the groups that drew spans without a device.

        A row that says only "device 0" sends the reader to the placement to learn whose bars these are.
        """
        placed: dict[int, dict[str, None]] = {device: {} for device in self.device_ids}  # dicts as ordered sets
        for (group, _), devices in self._devices.items():
            for device in devices:
                placed[device][group] = None
        labels = {device: f"device {device}: {', '.join(names) or 'idle'}" for device, names in placed.items()}
        host = dict.fromkeys(group for pid, group, _ in self._threads if pid == HOST_PID)
        if host:
            labels[HOST_PID] = f"host: {', '.join(host)}"
        return labels

    def chrome_trace_json(self) -> str:
        """The Chrome trace-event document: one process row per device (plus "host"), one thread per process.

        A span of a process holding several devices appears on each of their rows. Thread ids are unique per
        (row, group, rank): Perfetto's JSON importer treats a tid seen under a new pid as a new thread. Built by
        joining the events encoded in `add`, so its cost is copying the trace, not encoding it.
        """
        rows = [
            _encode(event)
            for index, (pid, label) in enumerate(self.row_labels().items())
            for event in (
                _meta("process_name", pid, 0, {"name": label}),
                _meta("process_sort_index", pid, 0, {"sort_index": index}),
            )
        ]
        events = ",".join([*rows, *self._events])
        other = _encode({"run_start_unix_s": self.start})
        return f'{{"traceEvents":[{events}],"displayTimeUnit":"ms","otherData":{other}}}'

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome trace to `path`; meant to be called every step, so the trace of a run that dies is
        there up to its last step.

        Safe: a temp file in the same folder renamed over `path` (`os.replace`), so a reader (the report, a trace
        viewer, `tail`) sees the previous trace or the new one, never half of one, and a failed write leaves no temp
        file; mode 0644 like the run's other files (a bare `mkstemp` makes 0600). Not fsynced: a trace is a
        diagnostic rewritten next step, not worth a disk flush per step. Cheap: no JSON encoding happens here (see
        `chrome_trace_json`): each span is encoded once, when `add` takes it, instead of the whole trace on every
        write.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), TRACE_MODE)
                f.write(self.chrome_trace_json())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def _encode_span(self, span: Span) -> Iterator[str]:
        """The trace events of one span, JSON-encoded: an "X" event on each row it belongs to, preceded by the
        metadata of its thread the first time that thread appears."""
        group, rank = span["group"], span["rank"]
        devices = self.devices_of(group, rank)
        for pid in devices or (HOST_PID,):
            key = (pid, group, rank)
            if key not in self._threads:
                tid = self._threads[key] = len(self._threads) + 1
                yield _encode(_meta("thread_name", pid, tid, {"name": f"{group} rank {rank}"}))
                yield _encode(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
            event = {
                "name": span["name"],
                "cat": group,
                "ph": "X",
                "ts": (span["start"] - self.start) * 1e6,
                "dur": (span["end"] - span["start"]) * 1e6,
                "pid": pid,
                "tid": self._threads[key],
                "args": {
                    "group": group,
                    "rank": rank,
                    "devices": list(devices),
                    **{key: span[key] for key in MEMORY_KEYS if key in span},
                },
            }
            yield _encode(event)


def _device_map(devices: Mapping[tuple[str, int], Sequence[int]]) -> dict[tuple[str, int], tuple[int, ...]]:
    return {(str(group), int(rank)): tuple(int(d) for d in devs) for (group, rank), devs in devices.items()}


def _encode(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
