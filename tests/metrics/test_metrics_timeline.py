"""Timeline: Chrome-trace structure and row labels, per-device busy fraction with overlapping spans, group overlap,
and the per-step write (atomic, world-readable)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rlplace.metrics import HOST_PID, Timeline

T = 1_000.0  # run start, unix seconds

# actor and rollout share device 0 (collocated); env rank 0 is CPU-only; rollout rank 1 holds devices 1 and 2.
DEVICES = {("actor", 0): [0], ("rollout", 0): [0], ("rollout", 1): [1, 2], ("env", 0): []}


def span(name: str, group: str, rank: int, start: float, end: float) -> dict:
    return {"name": name, "group": group, "rank": rank, "start": T + start, "end": T + end}


@pytest.fixture
def timeline() -> Timeline:
    tl = Timeline(DEVICES, num_devices=4, start=T)
    tl.extend(
        [
            span("generate", "rollout", 0, 0.0, 4.0),
            span("train", "actor", 0, 3.0, 6.0),
            span("generate", "rollout", 1, 1.0, 2.0),
            span("simulate", "env", 0, 2.0, 5.0),
            span("generate_rollouts", "driver", 0, 0.0, 5.0),
        ]
    )
    return tl


def test_busy_frac_counts_overlapping_spans_on_one_device_once(timeline: Timeline) -> None:
    # device 0: rollout [0, 4] and actor [3, 6] overlap on [3, 4]; union = [0, 6] = 6 s.
    # window [0, 10]: 6 / 10 = 0.6 (not (4 + 3) / 10 = 0.7).
    assert timeline.busy_frac(0, T, T + 10) == pytest.approx(0.6)
    # clipped window [2, 5]: union clipped = [2, 5] = 3 s of 3 s -> 1.0
    assert timeline.busy_frac(0, T + 2, T + 5) == pytest.approx(1.0)
    # devices 1 and 2: rollout rank 1 spans both, [1, 2] -> 1 / 10; device 3 is held but idle; env and driver
    # (no devices) count toward no device.
    assert timeline.utilization(T, T + 10) == pytest.approx(
        {
            "util/device_0/busy_frac": 0.6,
            "util/device_1/busy_frac": 0.1,
            "util/device_2/busy_frac": 0.1,
            "util/device_3/busy_frac": 0.0,
        }
    )


def test_overlap_between_groups(timeline: Timeline) -> None:
    # rollout busy [0, 4] (rank 1's [1, 2] lies inside), env busy [2, 5] -> both busy on [2, 4] = 2 s
    assert timeline.overlap("rollout", "env", T, T + 10) == pytest.approx(2.0)
    # actor [3, 6] with env [2, 5] -> [3, 5] = 2 s; clipped to window [0, 4] -> [3, 4] = 1 s
    assert timeline.overlap("actor", "env", T, T + 10) == pytest.approx(2.0)
    assert timeline.overlap("actor", "env", T, T + 4) == pytest.approx(1.0)
    assert timeline.overlap("actor", "nobody", T, T + 10) == 0.0
    assert timeline.busy_seconds("rollout", T, T + 10) == pytest.approx(4.0)


def test_chrome_trace_structure(timeline: Timeline, tmp_path) -> None:
    path = timeline.write(tmp_path / "timeline.json")
    trace = json.loads(path.read_text())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    # each row names who works there: components in mapping order, "idle", and the host's groups in order of arrival
    assert names == {
        0: "device 0: actor, rollout",
        1: "device 1: rollout",
        2: "device 2: rollout",
        3: "device 3: idle",
        HOST_PID: "host: env, driver",
    }

    complete = [e for e in events if e["ph"] == "X"]
    # rollout rank 1 holds two devices, so its span appears on both rows: 5 spans -> 6 events
    assert len(complete) == 6
    train = next(e for e in complete if e["name"] == "train")
    assert train["pid"] == 0 and train["cat"] == "actor"
    assert train["ts"] == pytest.approx(3.0e6) and train["dur"] == pytest.approx(3.0e6)
    assert train["args"] == {"group": "actor", "rank": 0, "devices": [0]}
    assert sorted(e["pid"] for e in complete if e["cat"] == "rollout") == [0, 1, 2]
    assert {e["pid"] for e in complete if e["cat"] in ("env", "driver")} == {HOST_PID}

    # one thread row per (row, group, rank): actor and rollout share device 0 but get their own rows
    thread_names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert len(thread_names) == len({(e["pid"], e["tid"]) for e in complete}) == 6
    assert thread_names[(0, train["tid"])] == "actor rank 0"
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable by whoever reads the run folder


def test_write_appends_across_steps(tmp_path) -> None:
    tl = Timeline({("actor", 0): [0]}, start=T)
    tl.add(span("train", "actor", 0, 0.0, 1.0))
    tl.write(tmp_path / "timeline.json")
    tl.add(span("train", "actor", 0, 2.0, 3.0))
    trace = json.loads(tl.write(tmp_path / "timeline.json").read_text())
    assert [e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"] == pytest.approx([0.0, 2.0e6])


def test_a_failed_write_keeps_the_previous_trace_and_no_temp_file(tmp_path, monkeypatch) -> None:
    tl = Timeline({("actor", 0): [0]}, start=T)
    tl.add(span("train", "actor", 0, 0.0, 1.0))
    before = tl.write(tmp_path / "timeline.json").read_text()
    tl.add(span("train", "actor", 0, 2.0, 3.0))

    def disk_full(*args: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space"):
        tl.write(tmp_path / "timeline.json")
    assert (tmp_path / "timeline.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.json"]


def test_refuses_bad_input() -> None:
    tl = Timeline({("actor", 0): [0]}, start=T)
    with pytest.raises(ValueError, match="ends before it starts"):
        tl.add(span("train", "actor", 0, 2.0, 1.0))
    with pytest.raises(ValueError, match="lacks"):
        tl.add({"name": "train", "group": "actor"})
    with pytest.raises(ValueError, match="t1 > t0"):
        tl.busy_frac(0, T, T)
    with pytest.raises(ValueError, match="unknown device 5"):
        tl.busy_frac(5, T, T + 1)
    with pytest.raises(ValueError, match="num_devices=2"):
        Timeline({("actor", 0): [3]}, num_devices=2)


def test_memory_per_device_and_phase_sums_peaks_of_the_busy_and_residents_of_the_idle() -> None:
    """Collocated on device 0: in generation the rollout peaks at 5 GB while the offloaded actor left 1 GB; in
    training the actor peaks at 7 GB while the rollout left 2 GB. Processes without device memory count nothing."""
    gb = 10**9
    tl = Timeline(DEVICES, num_devices=4, start=T)

    def used(name: str, group: str, start: float, end: float, peak: float, resident: float) -> dict:
        return {**span(name, group, 0, start, end), "peak_bytes": int(peak * gb), "resident_bytes": int(resident * gb)}

    tl.extend(
        [
            used("offload", "actor", 0.0, 0.5, 9, 1),
            span("generate_rollouts", "driver", 0, 1.0, 4.0),
            used("generate", "rollout", 1.0, 4.0, 5, 3),
            used("offload", "rollout", 4.0, 4.5, 3, 2),
            span("training", "driver", 0, 5.0, 8.0),
            used("train", "actor", 5.0, 8.0, 7, 6),
            span("env_step", "env", 0, 1.0, 4.0),
        ]
    )
    assert tl.memory(T, T + 9, ["generate_rollouts", "training", "sync_weights"]) == {
        "memory/device_0/generate_rollouts_gb": pytest.approx(5 + 1),
        "memory/device_0/training_gb": pytest.approx(7 + 2),
    }
    trace = json.loads(tl.chrome_trace_json())
    train = next(e for e in trace["traceEvents"] if e.get("name") == "train")
    assert (train["args"]["peak_bytes"], train["args"]["resident_bytes"]) == (7 * gb, 6 * gb)
    assert Timeline(DEVICES, num_devices=4, start=T).memory(T, T + 9, ["training"]) == {}
