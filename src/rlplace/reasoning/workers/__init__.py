"""The worker groups of a reasoning run: generation (rollout), the verifier (reward), log-probs (inference) and
the policy update (actor).

The classes are imported on first use (PEP 562): Ray imports this package in every worker's process, and a reward
or rollout process must not import the actor's training stack (distributed checkpointing, the optimizers' state,
the value model) through its siblings; each process pays only for the modules its own worker needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlplace.lazy import lazy_exports

if TYPE_CHECKING:
    from .actor import LLMActorWorker
    from .inference import InferenceWorker
    from .reward import RewardWorker
    from .rollout import LLMRolloutWorker

__all__ = ["InferenceWorker", "LLMActorWorker", "LLMRolloutWorker", "RewardWorker"]
__getattr__ = lazy_exports(
    __name__,
    {
        "InferenceWorker": "inference",
        "LLMActorWorker": "actor",
        "LLMRolloutWorker": "rollout",
        "RewardWorker": "reward",
    },
)
