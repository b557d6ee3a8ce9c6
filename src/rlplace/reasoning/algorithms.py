"""The reasoning algorithms: `algorithm.name` -> its advantage estimator and the traits the rest of the code asks
about (a critic, the smallest group, where a KL penalty may go); and the names that configs are checked against of
the policy loss's forms every algorithm can take (`LOSS_AGGREGATIONS`, `IMPORTANCE_RATIOS`) and of the controllers of
a KL coefficient (`KL_CONTROLLERS`).

A new algorithm is an estimator `(batch, algorithm section, values, sum_over_ranks) -> (advantages, returns)` and one
`ALGORITHMS.register` line here, plus its option file `conf/algorithm/<name>.yaml`. Pure Python: configs are checked
against this registry before Ray or torch load; the estimator (torch) is imported where advantages are computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlplace.core.registry import Registry, load


@dataclass(frozen=True)
class Algorithm:
    """One reasoning algorithm."""

    estimator: str
    """`package.module:function` of its advantage estimator, imported by `advantage_estimator`."""
    critic: bool = False
    """It trains a critic (a value head on its own copy of the LM), whose rollout-time values the estimator reads."""
    min_group_size: int = 1
    """The fewest responses per prompt it works with (a group baseline needs 2)."""
    kl_in_reward: bool = True
    """A KL penalty may be folded into its token rewards (with use_kl_loss false); else the KL is only a loss term."""

    def advantage_estimator(self) -> Any:
        return load(self.estimator)


ALGORITHMS: Registry[Algorithm] = Registry("algorithm.name")
ALGORITHMS.register("grpo", Algorithm("rlplace.reasoning.update:estimate_grpo", min_group_size=2, kl_in_reward=False))
ALGORITHMS.register("ppo", Algorithm("rlplace.reasoning.update:estimate_ppo", critic=True))
ALGORITHMS.register("reinforce_pp", Algorithm("rlplace.reasoning.update:estimate_reinforce_pp", min_group_size=2))
ALGORITHMS.register("rloo", Algorithm("rlplace.reasoning.update:estimate_rloo", min_group_size=2))
ALGORITHMS.register("reinforce", Algorithm("rlplace.reasoning.update:estimate_reinforce"))

LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
"""How per-token losses become one number (`losses.aggregate_loss`)."""
IMPORTANCE_RATIOS = ("token", "sequence")
"""Where the policy loss takes its importance ratio: per token (PPO's) or per response (GSPO's)."""
KL_CONTROLLERS = ("fixed", "adaptive")
"""How the coefficient of a KL in the reward evolves (`advantages.adaptive_kl_coef`)."""
