"""What an offline wandb run recorded, read back from its `run-*.wandb` log without a server.

The wandb in use writes no `files/wandb-summary.json` for an offline run: the summary that `wandb sync` uploads is
the one its log ends with, every summary record applied in order. The log is LevelDB's log format (what wandb calls
its data store): a 7-byte file header, then 32 KiB blocks of chunks, each a 7-byte header (crc, length, kind) and a
piece of one protobuf `Record`.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(log: Path) -> Iterator[Any]:
    """Every protobuf `Record` of a `.wandb` log written in full so far, in the order written."""
    data = log.read_bytes()
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        if pos + HEADER + length > len(data):  # a chunk that wandb's service is still writing
            return
        pieces += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def finished_log(run_dir: Path, timeout_s: float = 60.0) -> Path:
    """The run's `.wandb` log once it holds the run's exit record: `run.finish()` can return before wandb's service
    process has flushed the log to disk."""
    (log,) = run_dir.glob("run-*.wandb")
    deadline = time.monotonic() + timeout_s
    while not any(record.WhichOneof("record_type") == "exit" for record in records(log)):
        assert time.monotonic() < deadline, f"{log} holds no exit record after {timeout_s} s"
        time.sleep(0.1)
    return log


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def final_summary(run_dir: Path) -> dict[str, Any]:
    """The summary an offline run (`.../wandb/offline-run-*`) ends with."""
    log = finished_log(run_dir)
    summary: dict[str, Any] = {}
    for record in records(log):
        if record.WhichOneof("record_type") == "summary":
            summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
            for item in record.summary.remove:
                summary.pop(_key(item), None)
    return summary


def config(run_dir: Path) -> dict[str, Any]:
    """The run's config as recorded (key -> value), every config record applied in order."""
    log = finished_log(run_dir)
    values: dict[str, Any] = {}
    for record in records(log):
        kind = record.WhichOneof("record_type")
        if kind in ("config", "run"):
            items = record.config.update if kind == "config" else record.run.config.update
            values.update({_key(item): json.loads(item.value_json) for item in items})
    return values


def record_kinds(run_dir: Path) -> list[str]:
    """The kind of every record (run, history, summary, artifact, ...), in order."""
    log = finished_log(run_dir)
    return [record.WhichOneof("record_type") for record in records(log)]
