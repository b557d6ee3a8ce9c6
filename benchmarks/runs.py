"""One `rlplace-train` run as a benchmark script starts it: a subprocess into a folder of its own, removed after."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple


class Finished(NamedTuple):
    """What a finished run left: its last metrics row and its summary."""

    last: dict[str, Any]
    summary: dict[str, Any]


def train(overrides: list[str], cache: str | None = None) -> Finished:
    """Run `python -m rlplace.train *overrides logger=jsonl` to the end (CalledProcessError if it fails). `cache` is
    the outputs folder (RLPLACE_OUTPUT_DIR) where a pretrained model is kept for the runs that share it; None: the
    run's own folder."""
    with tempfile.TemporaryDirectory(prefix="rlplace-bench-") as folder:
        run_dir = Path(folder) / "run"
        command = [sys.executable, "-m", "rlplace.train", *overrides, "logger=jsonl", f"hydra.run.dir={run_dir}"]
        env = {**os.environ, "RLPLACE_OUTPUT_DIR": cache or folder}
        subprocess.run(command, check=True, capture_output=True, env=env)
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        return Finished(json.loads(rows[-1]), json.loads((run_dir / "summary.json").read_text()))
