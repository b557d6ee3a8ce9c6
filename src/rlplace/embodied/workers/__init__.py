"""The worker groups of an embodied run: simulators (env), policy inference (rollout) and PPO training (actor).

Each is imported on first use (PEP 562): Ray imports this package in every worker process, and an env process,
which only steps simulators, must not import torch through the actor's module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .actor import ActorWorker
    from .env import EnvWorker
    from .rollout import RolloutWorker

_MODULE_OF = {"ActorWorker": "actor", "EnvWorker": "env", "RolloutWorker": "rollout"}
__all__ = ["ActorWorker", "EnvWorker", "RolloutWorker"]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
