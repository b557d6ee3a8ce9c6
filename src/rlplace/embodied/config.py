"""The embodied family's schema: a simulator task, an MLP policy, PPO, and policy inference as the rollout.

Each section is the base dataclass that the option files of its config group start from
(`rlplace/conf/task/cartpole.yaml` begins with `defaults: [/schema/task/embodied@_here_]`), and `EmbodiedConfig` is the
whole run that `to_typed` builds. Field checks sit next to the fields; checks that need the placement are in
`checks.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlplace.core.config import ComponentConfig, PolicyGradientConfig, RunConfig
from rlplace.core.errors import check, check_choice
from rlplace.embodied.algorithms import ADVANTAGE_ESTIMATORS, ALGORITHMS

FAMILY = "embodied"
COMPONENTS = ("env", "rollout", "actor")
"""The worker groups of an embodied run; each must be placed, and nothing else may be."""


@dataclass
class EmbodiedTaskConfig:
    """A gymnasium simulator task, run as many sub-environments split over the env workers."""

    name: str = "cartpole"
    """The task's name in logs, run names and wandb tags (its option file's name: `cartpole`, `halfcheetah`)."""
    env_id: str = "CartPole-v1"
    """A registered gymnasium environment id: what the env workers simulate."""
    total_num_envs: int = 8
    """Sub-environments across all env workers; split evenly over env processes and pipeline stages."""
    max_episode_steps: int | None = None
    """Episode cap; None keeps the environment's own."""
    solved_return: float | None = None
    """Mean return over the last 20 episodes at which the task counts as solved; None: never."""
    normalize_observation: bool = False
    """Standardise each sub-env's observations by their running mean and variance, clipped to +-10 (CleanRL's
    continuous-control PPO; `envs.normalize`)."""
    normalize_reward: bool = False
    """Scale each sub-env's rewards by the running standard deviation of its discounted return (algorithm.gamma),
    clipped to +-10; episode returns are still reported in the simulator's own rewards."""

    def __post_init__(self) -> None:
        check(self.total_num_envs >= 1, "task.total_num_envs", self.total_num_envs, "at least 1")
        check(
            self.max_episode_steps is None or self.max_episode_steps >= 1,
            "task.max_episode_steps",
            self.max_episode_steps,
            "null (the environment's own cap) or at least 1",
        )


@dataclass
class PolicyConfig:
    """The actor-critic MLP; its head (discrete or continuous) follows the task's action space."""

    NAMES: ClassVar[tuple[str, ...]] = ("mlp_policy",)

    name: str = "mlp_policy"
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Width of each hidden layer; a costly benchmark policy widens and deepens it."""
    activation: str = "tanh"
    """Hidden activation: `tanh` or `relu`."""

    def __post_init__(self) -> None:
        check_choice("model.name", self.name, self.NAMES)
        check(all(h >= 1 for h in self.hidden_sizes), "model.hidden_sizes", self.hidden_sizes, "positive widths")
        check_choice("model.activation", self.activation, ("tanh", "relu"))


@dataclass
class PPOConfig(PolicyGradientConfig):
    """PPO with a critic, CleanRL's update; advantages by GAE or group-normalised returns."""

    adv_estimator: str = "gae"
    """A registered estimator (`rlplace.embodied.algorithms.ADVANTAGE_ESTIMATORS`): `gae`, or `group_norm` for returns
    normalised within groups of `group_size` neighbouring sub-envs."""
    norm_adv: bool = True
    """Normalise advantages per minibatch to zero mean and unit std."""

    def __post_init__(self) -> None:
        super().__post_init__()
        ALGORITHMS.check(self.name)
        ADVANTAGE_ESTIMATORS.check(self.adv_estimator)


@dataclass
class PolicyRolloutConfig(ComponentConfig):
    """Policy inference answering env observations, stage by stage."""

    NAMES: ClassVar[tuple[str, ...]] = ("policy",)

    backend: str = "policy"
    num_steps: int = 128
    """Env steps per sub-environment per training step (the rollout horizon T)."""
    pipeline_stage_num: int = 1
    """Stages each env worker's sub-envs are split into; rollout infers stage s while env simulates stage s+1."""

    def __post_init__(self) -> None:
        check_choice("rollout.backend", self.backend, self.NAMES)
        check(self.num_steps >= 1, "rollout.num_steps", self.num_steps, "at least 1")
        check(self.pipeline_stage_num >= 1, "rollout.pipeline_stage_num", self.pipeline_stage_num, "at least 1")


@dataclass
class EmbodiedConfig(RunConfig):
    """A whole embodied run."""

    components: ClassVar[tuple[str, ...]] = COMPONENTS
    """Its worker groups, for the placement (`HybridComponentPlacement(cfg)`)."""

    task: EmbodiedTaskConfig = field(default_factory=EmbodiedTaskConfig)
    model: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: PPOConfig = field(default_factory=PPOConfig)
    rollout: PolicyRolloutConfig = field(default_factory=PolicyRolloutConfig)
    actor: ComponentConfig = field(default_factory=ComponentConfig)
    env: ComponentConfig = field(default_factory=ComponentConfig)
    """Simulators hold no device memory on CPU; their offload is a recorded no-op that keeps the phase visible."""
