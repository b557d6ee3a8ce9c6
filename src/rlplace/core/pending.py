"""The batches an actor rank received but has not trained on yet (asynchronous training), in a checkpoint.

Every rank writes its own to `pending/<rank>.pt`; a resumed rank reads every rank's, since under another placement
it may train on data that other ranks held (each family re-splits them: by env column, by micro-batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

PENDING_DIR = "pending"
"""The checkpoint's subfolder of pending batches, one file per actor rank."""


def save_pending(folder: str | Path, rank: int, pending: Sequence[Any]) -> None:
    """Write this rank's pending batches, oldest first (nothing when there are none)."""
    if pending:
        (Path(folder) / PENDING_DIR).mkdir(exist_ok=True)  # every rank makes it; the first one wins
        torch.save(list(pending), Path(folder) / PENDING_DIR / f"{rank}.pt")


def load_pending(folder: str | Path) -> list[tuple[Any, ...]]:
    """Per pending step, oldest first, what each rank that wrote pending batches held of it, in rank order."""
    paths = sorted((Path(folder) / PENDING_DIR).glob("*.pt"), key=lambda path: int(path.stem))
    return list(zip(*(torch.load(path, weights_only=False) for path in paths), strict=True))
