"""The learning rate of each update: warmup, then constant or decaying to a floor over the run, one rule for both
families' actors.

The factor is a pure function of the step, so a resumed or re-placed run sets the rate its uninterrupted run would
have set, with nothing to checkpoint. Without warmup, linear decay to 0 is CleanRL's `anneal_lr` (lr x (1 - step /
max_steps)); cosine decay, a floor and a warmup are what LLM RL recipes use (verl's and OpenRLHF's cosine schedules
with warmup).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlplace.core.config import PolicyGradientConfig

LR_DECAYS = ("linear", "cosine")
"""How `anneal_lr` lowers the rate after the warmup."""


def lr_factor(alg: PolicyGradientConfig, step: int, max_steps: int) -> float:
    """The multiple of `algorithm.lr` for the update of step `step` (0-based) of a `max_steps` run: (step + 1) /
    lr_warmup_steps during the warmup, then 1, or with anneal_lr falling from 1 at the end of the warmup towards
    min_lr_ratio at max_steps, linearly or along a half cosine (`lr_decay`)."""
    if step < alg.lr_warmup_steps:
        return (step + 1) / alg.lr_warmup_steps
    if not alg.anneal_lr:
        return 1.0
    progress = (step - alg.lr_warmup_steps) / (max_steps - alg.lr_warmup_steps)
    shape = 1.0 - progress if alg.lr_decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return alg.min_lr_ratio + (1.0 - alg.min_lr_ratio) * shape
