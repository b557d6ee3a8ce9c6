"""An actor's models and optimizers in a checkpoint, with `torch.distributed.checkpoint` (DCP), whatever the strategy.

Each rank writes the shards it holds (a replicated tensor once, by one rank) into one folder, with metadata that says
which part of which tensor every file holds. On load each rank reads the parts its own shards cover, so a folder
written by 2 FSDP ranks resumes on 1 full replica, and the reverse, and under another placement: the state dicts go
through `get_state_dict` / `set_state_dict`, whose keys are the model's own parameter names under any wrapping.
"""

from __future__ import annotations

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


def save_training_state(folder: Path, parts: Trained) -> None:
    """Write every model and optimizer of `parts` into `folder`; every rank calls it. A single rank has no process
    group: it says so (`no_dist`), which is what DCP would assume, with a warning on every save."""
    dcp.save(_state(parts), checkpoint_id=folder, no_dist=not dist.is_initialized())


def load_training_state(folder: Path, parts: Trained) -> None:
    """Read what `save_training_state` wrote, under this process's strategy and rank count, into `parts`."""
    state = _state(parts)
    dcp.load(state, checkpoint_id=folder, no_dist=not dist.is_initialized())
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[name], optim_state_dict=state[f"{name}_optimizer"])
