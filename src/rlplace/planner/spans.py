"""What the workers of a profiled run would have needed alone, read from its timeline.

A span times one piece of a worker's work inside the run's loop, where the processes sharing its cores were busy
too part of the time. Cores are shared in turn (processor sharing): while n processes pinned to a core are busy, each
advances at 1/n of it. So a span's work alone is the integral of 1/n over its length, n counted from every worker's
busy spans on the span's cores. Processes not pinned to cores (a GPU's, a node group's) are taken as having their
resources to themselves: their spans count as they are.

A `Trace` is a run's timeline.json read once: every question the planner asks of it (work alone, spans as they
were, memory peaks) is asked over the same parsed spans and the same measured steps (those after the warm-up, or all
of them when the run was shorter).
"""

from __future__ import annotations

import bisect
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlplace.metrics.logger import WARMUP_STEPS

Process = tuple[str, int]
"""A worker process: (group, rank)."""
DRIVER = "driver"


class Trace:
    """The complete spans ("X" events) of a timeline.json, and the windows of its measured steps."""

    def __init__(self, timeline_text: str) -> None:
        self.events = [e for e in json.loads(timeline_text)["traceEvents"] if e.get("ph") == "X"]
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in self.events if e["name"] == "step")
        self.measured = steps[WARMUP_STEPS:] or steps
        """(start, end) of each measured step, in the timeline's microseconds."""

    def _in_measured(self, start: float, end: float) -> bool:
        return any(s <= start and end <= t for s, t in self.measured)

    def alone_work(self, cores: Mapping[int, Sequence[int]], names: Iterable[str]) -> dict[tuple[str, str], float]:
        """(group, span name) -> seconds of that work per step, summed over the group's ranks, as the ranks would
        have needed it alone: the median over the measured steps. Only spans named in `names` are counted; every
        worker span counts toward how busy a core was."""
        names = set(names)
        spans: dict[tuple[float, float, str, int, str], tuple[int, ...]] = {}
        for e in self.events:
            args = e.get("args", {})
            if args.get("group", DRIVER) == DRIVER or "rank" not in args:
                continue
            key = (e["ts"], e["ts"] + e["dur"], args["group"], args["rank"], e["name"])
            # A process on several devices has its span on each device's row: once each here, on all their cores.
            found = {*spans.get(key, ()), *(c for d in args.get("devices", ()) for c in cores[d])}
            spans[key] = tuple(sorted(found))
        slowdown = _sharing(spans)
        per_step: dict[tuple[str, str], list[float]] = defaultdict(list)
        for start, end in self.measured:
            work: dict[tuple[str, str], float] = defaultdict(float)
            for (s, e, group, rank, name), on in spans.items():
                if name in names and start <= s and e <= end:
                    work[group, name] += slowdown(s, e, on, (group, rank))
            for key, seconds in work.items():
                per_step[key].append(seconds)
        return {key: statistics.median(values) for key, values in per_step.items()}

    def rank_seconds(self, group: str, name: str) -> dict[int, float]:
        """Rank -> median seconds of its `name` spans, for group `group`, over the measured steps, as they were:
        with whatever shared their cores."""
        found: dict[int, set[tuple[float, float]]] = defaultdict(set)
        for e in self.events:
            args = e.get("args", {})
            if e["name"] == name and args.get("group") == group and self._in_measured(e["ts"], e["ts"] + e["dur"]):
                found[args["rank"]].add((e["ts"], e["dur"] / 1e6))  # once per process, whatever its devices
        return {rank: statistics.median(d for _, d in spans) for rank, spans in found.items()}

    def phase_peaks(self, phases: Iterable[str]) -> dict[tuple[str, str], int]:
        """(group, phase) -> the most device bytes rank 0 of the group held in the driver's `phase` over the
        measured steps: its peak in its spans that overlap the phase, or, idle in it, what its last span before the
        phase left allocated. Empty when no span carries memory (processes on CUDA devices record it; CPU runs do
        not)."""
        phases = set(phases)
        windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
        held: dict[str, set[tuple[float, float, int, int]]] = defaultdict(set)
        for e in self.events:
            args = e.get("args", {})
            start, end = e["ts"], e["ts"] + e["dur"]
            if args.get("group", DRIVER) == DRIVER:
                if e["name"] in phases and self._in_measured(start, end):
                    windows[e["name"]].append((start, end))
            elif args.get("rank") == 0 and "peak_bytes" in args:
                held[args["group"]].add((start, end, args["peak_bytes"], args["resident_bytes"]))
        found: dict[tuple[str, str], int] = {}
        for group, spans in held.items():
            for phase, intervals in windows.items():
                for start, end in intervals:
                    inside = [peak for s, e, peak, _ in spans if s < end and e > start]
                    before = max(((e, resident) for s, e, _, resident in spans if e <= start), default=(0.0, 0))
                    used = max(inside) if inside else before[1]
                    found[group, phase] = max(found.get((group, phase), 0), used)
        return found


def _sharing(spans: Mapping[tuple[float, float, str, int, str], tuple[int, ...]]) -> Any:
    """A function (start, end, cores, process) -> seconds of that interval as the process would have needed them
    alone, given every process's busy intervals on those cores (timeline microseconds in, seconds out)."""
    busy: dict[Process, list[tuple[float, float]]] = defaultdict(list)
    on_core: dict[int, set[Process]] = defaultdict(set)
    for (s, e, group, rank, _), on in spans.items():
        busy[group, rank].append((s, e))
        for core in on:
            on_core[core].add((group, rank))
    merged = {process: _merge(intervals) for process, intervals in busy.items()}
    # Per core: the times at which its count of busy processes changes, and the count after each.
    counts: dict[int, tuple[list[float], list[int]]] = {}
    for core, processes in on_core.items():
        changes: dict[float, int] = defaultdict(int)
        for process in processes:
            for s, e in merged[process]:
                changes[s] += 1
                changes[e] -= 1
        times, levels, level = [], [], 0
        for t in sorted(changes):
            level += changes[t]
            times.append(t)
            levels.append(level)
        counts[core] = (times, levels)

    def alone(start: float, end: float, on: tuple[int, ...], process: Process) -> float:
        if not on:
            return (end - start) / 1e6
        cuts = sorted({start, end, *(t for c in on for t in counts[c][0] if start < t < end)})
        total = 0.0
        for a, b in zip(cuts, cuts[1:], strict=False):
            sharers = statistics.fmean(max(1, _level(counts[c], a)) for c in on)
            total += (b - a) / sharers
        return total / 1e6

    return alone


def _level(count: tuple[list[float], list[int]], t: float) -> int:
    """How many processes were busy on a core just after time `t`."""
    times, levels = count
    i = bisect.bisect_right(times, t) - 1
    return levels[i] if i >= 0 else 0


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as disjoint sorted intervals (a process's nested spans are one busy stretch)."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged
