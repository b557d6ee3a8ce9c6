"""Throughput as pure functions.

Per-device numbers divide by every device the run holds, not only the busy ones: a collocated run and a
disaggregated run on the same 8 devices are compared per device of the budget, so idle devices count against the
placement that leaves them idle.
"""

from __future__ import annotations


def throughput(count: float, seconds: float) -> float:
    """Items per second. A non-positive duration is a timing bug, so it raises rather than returning inf."""
    if seconds <= 0:
        raise ValueError(f"throughput needs a positive duration, got {seconds!r} s for count {count!r}")
    return float(count) / float(seconds)


def per_device(value: float, num_devices: int) -> float:
    """`value` divided over `num_devices` (the run's whole device budget)."""
    if num_devices < 1:
        raise ValueError(f"per_device needs at least one device, got num_devices={num_devices!r}")
    return float(value) / num_devices


def throughput_metrics(
    seconds: float,
    num_devices: int,
    *,
    env_steps: float | None = None,
    tokens: float | None = None,
) -> dict[str, float]:
    """`throughput/{env_steps,tokens}_per_s` and their `_per_device` variants for one step.

    Counts left as None are omitted, so an embodied task reports env steps and a reasoning task reports tokens
    with the same call.
    """
    metrics: dict[str, float] = {}
    for name, count in (("env_steps", env_steps), ("tokens", tokens)):
        if count is None:
            continue
        rate = throughput(count, seconds)
        metrics[f"throughput/{name}_per_s"] = rate
        metrics[f"throughput/{name}_per_s_per_device"] = per_device(rate, num_devices)
    return metrics
