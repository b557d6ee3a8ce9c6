"""Metrics layer: phase timers, the device timeline, throughput, logger backends and a console progress bar.

The driver feeds this layer plain data (span dicts, counts, seconds, metric dicts); nothing here imports Ray or
Hydra, so every piece is testable on its own and the same vocabulary (`time/*`, `throughput/*`,
`util/device_<i>/busy_frac`) serves every task and every placement.
"""

from __future__ import annotations

from .logger import (
    BACKENDS,
    JsonlLogger,
    MetricLogger,
    MultiLogger,
    NullLogger,
    TrackerRun,
    WandbLogger,
    build_logger,
    read_jsonl,
    summarize,
    wandb_unavailable,
)
from .progress import TrainingProgress
from .throughput import per_device, throughput, throughput_metrics
from .timeline import HOST_PID, Span, Timeline
from .timers import PhaseTimer, process_uptime_s

__all__ = [
    "BACKENDS",
    "HOST_PID",
    "JsonlLogger",
    "MetricLogger",
    "MultiLogger",
    "NullLogger",
    "PhaseTimer",
    "Span",
    "Timeline",
    "TrackerRun",
    "TrainingProgress",
    "WandbLogger",
    "build_logger",
    "per_device",
    "process_uptime_s",
    "read_jsonl",
    "summarize",
    "throughput",
    "throughput_metrics",
    "wandb_unavailable",
]
