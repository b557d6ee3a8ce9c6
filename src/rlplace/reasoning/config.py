"""The reasoning family's schema: a task with a verifiable answer, a causal LM, GRPO/PPO/REINFORCE++, and LLM
generation as the rollout.

Each section is the base dataclass that the option files of its config group start from
(`rlplace/conf/task/arithmetic.yaml` begins with `defaults: [/schema/task/reasoning@_here_]`), and `ReasoningConfig` is
the whole run that `to_typed` builds. Field checks sit next to the fields; checks that need the placement are in
`checks.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlplace.core.config import ComponentConfig, PolicyGradientConfig, RunConfig
from rlplace.core.errors import check, check_choice
from rlplace.reasoning.generation.backends import BACKENDS
from rlplace.reasoning.rewards import reward_function
from rlplace.reasoning.tasks import TASKS

FAMILY = "reasoning"
COMPONENTS = ("rollout", "reward", "inference", "actor")
"""The worker groups of a reasoning run; each must be placed, and nothing else may be."""


@dataclass
class ReasoningTaskConfig:
    """Prompts with a reference answer, scored by the task's reward; a held-out split measures accuracy."""

    name: str = "arithmetic"
    """A registered task (`rlplace.reasoning.tasks.TASKS`): `arithmetic` (generated problems) or `jsonl` (your own
    lines)."""
    reward: str = "exact_match"
    """How a response is scored against the answer: a registered reward (`rlplace.reasoning.rewards.REWARDS`:
    `exact_match`) or `package.module:function` for your own `(response, answer) -> float`."""
    prompts_per_step: int = 32
    """Prompts per training step; each is answered algorithm.group_size times."""
    min_digits: int = 1
    """arithmetic: fewest digits of an operand."""
    max_digits: int = 2
    """arithmetic: most digits of an operand (digits are drawn uniformly in [min_digits, max_digits])."""
    operations: str = "+-"
    """arithmetic: the operators to draw from, a subset of `+-*`."""
    eval_size: int = 200
    """Problems in the held-out evaluation split."""
    data_seed: int = 0
    """Seed of the problem streams, fixed apart from runner.seed so that every run (and the cached pretrained
    model) sees the same held-out split."""
    train_path: str | None = None
    """jsonl: `{"prompt": ..., "answer": ...}` lines to train on."""
    eval_path: str | None = None
    """jsonl: held-out lines; None holds out eval_size lines of train_path."""

    def __post_init__(self) -> None:
        TASKS.check(self.name)
        reward_function(self.reward)
        check(self.prompts_per_step >= 1, "task.prompts_per_step", self.prompts_per_step, "at least 1")
        check(self.eval_size >= 1, "task.eval_size", self.eval_size, "at least 1")
        if self.name == "jsonl":
            check(self.train_path is not None, "task.train_path", self.train_path, "a jsonl file for task=jsonl")


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
class LMConfig:
    """The causal LM: the tiny LM built and pretrained here, or any local Hugging Face checkpoint."""

    NAMES: ClassVar[tuple[str, ...]] = ("tiny_lm", "hf")

    name: str = "tiny_lm"
    path: str | None = None
    """A local Hugging Face model folder. For `tiny_lm`, None builds and pretrains one, cached under outputs/."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """tiny_lm: how the cached starting checkpoint is made."""

    def __post_init__(self) -> None:
        check_choice("model.name", self.name, self.NAMES)
        if self.name == "hf":
            check(self.path is not None, "model.path", self.path, "a local Hugging Face model folder for model=hf")


@dataclass
class ReasoningAlgorithmConfig(PolicyGradientConfig):
    """GRPO, PPO (critic + token-level GAE) or REINFORCE++, on response tokens, with an optional KL to the
    reference (initial) model."""

    NAMES: ClassVar[tuple[str, ...]] = ("grpo", "ppo", "reinforce_pp")

    kl_coef: float = 0.0
    """Weight of the KL to the reference model; 0 skips the reference entirely."""
    kl_type: str = "low_var_kl"
    """KL estimator per token: `k1`, `k2`, or `low_var_kl` (k3)."""
    use_kl_loss: bool = True
    """KL as a loss term (GRPO's way); False subtracts it from the token rewards (PPO's and REINFORCE++'s way)."""
    loss_agg: str = "token_mean"
    """How token losses become one number: `token_mean` over all tokens, or `seq_mean_token_mean`."""
    critic_lr: float = 1.0e-3
    """ppo: learning rate of the critic (a value head on its own copy of the LM)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice("algorithm.name", self.name, self.NAMES)
        check_choice("algorithm.kl_type", self.kl_type, ("k1", "k2", "low_var_kl"))
        check_choice("algorithm.loss_agg", self.loss_agg, ("token_mean", "seq_mean_token_mean"))
        check(self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, "0 or more")
        if self.name in ("grpo", "reinforce_pp"):
            check(
                self.group_size >= 2,
                "algorithm.group_size",
                self.group_size,
                f"at least 2: {self.name} compares each response with the others of its prompt",
            )

    @property
    def kl_in_reward(self) -> bool:
        """The KL penalty is folded into the token rewards (ppo and reinforce_pp without use_kl_loss)."""
        return self.kl_coef > 0 and not self.use_kl_loss and self.name != "grpo"

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_coef > 0 and self.use_kl_loss


@dataclass
class GenerationConfig(ComponentConfig):
    """LLM generation: `hf` (transformers with a KV cache) or `vllm` (vLLM's offline engine)."""

    backend: str = "hf"
    """A registered backend (`rlplace.reasoning.generation.backends.BACKENDS`)."""
    max_new_tokens: int = 8
    """Most tokens generated per response."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (evaluation is greedy)."""
    micro_batch_prompts: int = 8
    """Prompts per micro-batch streamed rollout -> reward -> inference -> actor."""
    gpu_memory_utilization: float = 0.4
    """vllm on a GPU: the share of device memory the engine may take (it shares the device when collocated)."""
    cuda_graphs: bool = True
    """hf on a GPU: decode with a static KV cache, each step replayed as a CUDA graph (the same tokens as eager
    decoding, without a Python round per layer per token); ignored on CPU and by vllm."""
    compile_step: bool = False
    """hf with cuda_graphs: `torch.compile` the decode step before capturing it (fewer, fused kernels, faster than the
    uncompiled graphs), at the cost of a compile per batch-size bucket (benchmarks/gpu_suite.py, generation section)."""

    def __post_init__(self) -> None:
        BACKENDS.check(self.backend)
        check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "at least 1")
        check(self.temperature >= 0, "rollout.temperature", self.temperature, "0 (greedy) or more")
        check(self.micro_batch_prompts >= 1, "rollout.micro_batch_prompts", self.micro_batch_prompts, "at least 1")


@dataclass
class ReasoningConfig(RunConfig):
    """A whole reasoning run."""

    components: ClassVar[tuple[str, ...]] = COMPONENTS
    """Its worker groups, for the placement (`HybridComponentPlacement(cfg)`)."""

    task: ReasoningTaskConfig = field(default_factory=ReasoningTaskConfig)
    model: LMConfig = field(default_factory=LMConfig)
    algorithm: ReasoningAlgorithmConfig = field(default_factory=ReasoningAlgorithmConfig)
    rollout: GenerationConfig = field(default_factory=GenerationConfig)
    actor: ComponentConfig = field(default_factory=ComponentConfig)
