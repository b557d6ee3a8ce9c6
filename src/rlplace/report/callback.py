"""Hydra callback: write the sweep report when a multirun ends (configured in sweeps/*.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rlplace.report.write import write_report


class ReportCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        report = write_report(Path(config.hydra.sweep.dir))
        print(f"rlplace: sweep report in {report}")
