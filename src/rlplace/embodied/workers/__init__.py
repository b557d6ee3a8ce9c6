"""The worker groups of an embodied run: simulators (env), policy inference (rollout) and PPO training (actor).

Each is imported on first use (PEP 562): Ray imports this package in every worker process, and an env process,
which only steps simulators, must not import torch through the actor's module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplace.lazy import lazy_exports

if TYPE_CHECKING:
    from .actor import ActorWorker
    from .env import EnvWorker
    from .rollout import RolloutWorker

__all__ = ["ActorWorker", "EnvWorker", "RolloutWorker"]
__getattr__ = lazy_exports(__name__, {"ActorWorker": "actor", "EnvWorker": "env", "RolloutWorker": "rollout"})
