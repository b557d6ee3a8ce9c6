"""Hydra callback: write the sweep report when a multirun ends (configured in sweeps/*.yaml), and log it to wandb
when the sweep's jobs logged there.

Hydra turns an exception raised in a callback into a warning and lets the multirun exit 0, so a report that cannot
be written or logged would pass unnoticed: it ends the multirun here, with one line and exit code 2 (`cli.fail`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlplace.cli import fail
from rlplace.report.collect import ReportError
from rlplace.report.dashboard import SweepLogging, log_report, sweep_logging
from rlplace.report.write import Report, make_report


def one_line(err: BaseException) -> str:
    """An error as one line: a ReportError's own message, else its type and the first line of its message."""
    if isinstance(err, ReportError):
        return str(err)
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class ReportCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            report = make_report(sweep_dir)
            settings = sweep_logging(sweep_dir)
        except Exception as err:
            fail(f"the sweep report of {sweep_dir} could not be written: {one_line(err)}")
        print(f"rlplace: sweep report in {report.path}")
        publish(report, settings)


def publish(report: Report, settings: SweepLogging | None) -> None:
    """Log `report` to wandb when the sweep's jobs logged there (`settings`), saying where; a failure ends the
    process with one line and exit code 2."""
    if settings is None or settings.backend != "wandb":
        return
    try:
        run = log_report(report, settings)
    except Exception as err:
        fail(f"the sweep report in {report.path} could not be logged to wandb: {one_line(err)}")
    if run is not None:
        print(f"rlplace: sweep report on wandb in {run} (offline runs upload with `wandb sync`)")
