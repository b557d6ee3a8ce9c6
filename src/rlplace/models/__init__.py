"""Policies: the actor-critic MLP for embodied tasks."""

from .mlp_policy import MLPActorCritic

__all__ = ["MLPActorCritic"]
