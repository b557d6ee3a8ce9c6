"""Checkpoint folders, written atomically and found again for `runner.resume`.

A checkpoint is a folder `checkpoints/step_<k>` holding one file per writer (the driver's runner state, actor rank 0's
weights and optimizer, each env rank's simulators). Writers fill `step_<k>.tmp`; only when all are done does the
driver rename it, so a run killed mid-save leaves the previous checkpoint as the newest complete one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from rlplace.core.errors import ConfigError

_COMPLETE = re.compile(r"^step_(\d+)$")


def staging_dir(root: Path, step: int) -> Path:
    """A fresh temporary folder for the checkpoint of `step`; writers put their files here."""
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path) -> Path:
    """Publish a filled staging folder under its final name (an atomic rename on one filesystem)."""
    final = tmp.with_suffix("")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    steps = [(int(m.group(1)), p) for p in root.glob("step_*") if (m := _COMPLETE.match(p.name)) and p.is_dir()]
    return max(steps)[1] if steps else None


def step_of(path: Path) -> int:
    match = _COMPLETE.match(path.name)
    if match is None:
        raise ConfigError(f"runner.resume = {str(path)!r}: not a checkpoint folder (expected .../step_<k>)")
    return int(match.group(1))


def resolve_resume(resume: str | None, root: Path) -> Path | None:
    """Which checkpoint `runner.resume` names: None (start fresh), `auto` (newest under root, if any) or a path."""
    if resume is None:
        return None
    if resume == "auto":
        return latest(root)
    path = Path(resume)
    if not path.is_dir():
        raise ConfigError(f"runner.resume = {resume!r}: no such checkpoint folder (valid: null, auto, or a path)")
    step_of(path)
    return path
