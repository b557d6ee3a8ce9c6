"""The worker groups of a reasoning run: generation (rollout), the verifier (reward), log-probs (inference) and
the policy update (actor)."""

from .actor import LLMActorWorker
from .inference import InferenceWorker
from .reward import RewardWorker
from .rollout import LLMRolloutWorker

__all__ = ["InferenceWorker", "LLMActorWorker", "LLMRolloutWorker", "RewardWorker"]
