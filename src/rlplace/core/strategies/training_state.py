"""An actor's models and optimizers in a checkpoint, with `torch.distributed.checkpoint` (DCP), whatever the strategy.

Each rank writes the shards it holds (a replicated tensor once, by one rank) into one folder, with metadata that says
which part of which tensor every file holds. On load each rank reads the parts its own shards cover, so a folder
written by 2 FSDP ranks resumes on 1 full replica, and the reverse, and under another placement: the state dicts go
through `get_state_dict` / `set_state_dict`, whose keys are the model's own parameter names under any wrapping.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim import Optimizer

Trained = dict[str, tuple[nn.Module, Optimizer]]
"""Name -> a model and its optimizer (e.g. "policy", "critic")."""


def _state(parts: Trained) -> dict[str, dict]:
    state: dict[str, dict] = {}
    for name, (model, optimizer) in parts.items():
        state[name], state[f"{name}_optimizer"] = get_state_dict(model, optimizer)
    return state


@contextmanager
def single_process_quiet() -> Iterator[None]:
    """A single rank has no process group, which DCP handles as one process but warns about at every save and load:
    in a worker, that warning would reach the driver's console with each checkpoint."""
    with warnings.catch_warnings():
        if not dist.is_initialized():
            warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process", category=UserWarning)
        yield


def save_training_state(folder: Path, parts: Trained) -> None:
    """Write every model and optimizer of `parts` into `folder`; every rank calls it."""
    with single_process_quiet():
        dcp.save(_state(parts), checkpoint_id=folder)


def load_training_state(folder: Path, parts: Trained) -> None:
    """Read what `save_training_state` wrote, under this process's strategy and rank count, into `parts`."""
    state = _state(parts)
    with single_process_quiet():
        dcp.load(state, checkpoint_id=folder)
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optimizer"])
