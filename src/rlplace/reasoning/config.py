"""The reasoning family's schema: a task with a verifiable answer, a causal LM, GRPO/PPO/REINFORCE++, and LLM
generation as the rollout.

Each section is the base dataclass that the option files of its config group start from
(`rlplace/conf/model/tiny_lm.yaml` begins with `defaults: [/schema/model/reasoning@_here_]`), and `ReasoningConfig` is
the whole run that `to_typed` builds. A task's option file starts from that task's own schema instead
(`rlplace/conf/task/arithmetic.yaml`: `/schema/task/arithmetic`, `ArithmeticTaskConfig`), an extension of
`ReasoningTaskConfig` registered in `rlplace.reasoning.tasks.TASKS`. Field checks sit next to the fields; checks that
need the placement are in `checks.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from rlplace.core.config import ComponentConfig, PolicyGradientConfig, RunConfig
from rlplace.core.errors import check, check_choice
from rlplace.core.registry import absolute
from rlplace.core.strategies import AUTO, DTYPES, STRATEGIES, resolve
from rlplace.reasoning.algorithms import ALGORITHMS, IMPORTANCE_RATIOS, KL_CONTROLLERS, LOSS_AGGREGATIONS
from rlplace.reasoning.generation.backends import BACKENDS
from rlplace.reasoning.interactions import FEEDBACK, check_interaction
from rlplace.reasoning.models.registry import MODELS
from rlplace.reasoning.rewards import RewardFunction, reward_function
from rlplace.reasoning.tasks import ArithmeticTaskConfig, DatasetTaskConfig, ReasoningTaskConfig
from rlplace.reasoning.tools import RESULT, tool_function, tool_specs

FAMILY = "reasoning"
COMPONENTS = ("rollout", "reward", "inference", "actor")
"""The worker groups of a reasoning run; each must be placed, and nothing else may be."""
OFFLOAD_SWITCHES = ("actor", "rollout", "inference")
"""The components whose `enable_offload` placement presets, `placement=auto` and the memory check choose (a reward
model's is on by default and left as the run sets it)."""
BEHAVIOUR_LOGPROBS = ("inference", "rollout")
"""`algorithm.behaviour_logprobs`: which group's log-probs stand for the policy that sampled a response."""

__all__ = [
    "ActorConfig",
    "ArithmeticTaskConfig",
    "GenerationConfig",
    "DatasetTaskConfig",
    "InferenceConfig",
    "LMConfig",
    "LoRAConfig",
    "MultiTurnConfig",
    "PretrainConfig",
    "ReasoningAlgorithmConfig",
    "ReasoningConfig",
    "ReasoningTaskConfig",
    "RewardConfig",
]


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
        check(self.lr > 0, "model.pretrain.lr", self.lr, "positive")
        check(self.seed >= 0, "model.pretrain.seed", self.seed, "0 or more")
        check(0 < self.target_accuracy <= 1, "model.pretrain.target_accuracy", self.target_accuracy, "in (0, 1]")
        check(self.eval_interval >= 1, "model.pretrain.eval_interval", self.eval_interval, "at least 1")


@dataclass
class LMConfig:
    """The causal LM: a tiny one built and pretrained here, or any local Hugging Face checkpoint."""

    name: str = "tiny_lm"
    """A registered model kind (`rlplace.reasoning.models.registry.MODELS`): `tiny_lm`, `tiny_qwen2` (built here),
    `hf` (model.path)."""
    path: str | None = None
    """A local Hugging Face model folder. For a kind that builds, None builds and pretrains one, cached under
    outputs/."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """Built kinds: how the cached starting checkpoint is made."""

    def __post_init__(self) -> None:
        if MODELS[self.name].build is None:
            check(
                self.path is not None,
                "model.path",
                self.path,
                f"a local Hugging Face model folder for model={self.name}",
            )


@dataclass
class ReasoningAlgorithmConfig(PolicyGradientConfig):
    """GRPO, PPO (critic + token-level GAE), REINFORCE++ (with or without the group baseline) or RLOO, on response
    tokens, with an optional KL to the reference (initial) model, and the policy loss's forms (Dr. GRPO's, GSPO's,
    dual clip) open to each."""

    kl_coef: float = 0.0
    """Weight of the KL to the reference model; 0 skips the reference entirely."""
    kl_type: str = "low_var_kl"
    """KL estimator per token: `k1`, `k2`, or `low_var_kl` (k3)."""
    use_kl_loss: bool = True
    """KL as a loss term (GRPO's way); False subtracts it from the token rewards (PPO's and REINFORCE++'s way)."""
    kl_ctrl: str = "fixed"
    """The coefficient of a KL in the reward: `fixed` (kl_coef throughout) or `adaptive`, which starts at kl_coef
    and after each step moves it towards keeping the rollout's KL to the reference at kl_target (Ziegler et al. 2019;
    verl's kl_ctrl.type, OpenRLHF's --kl_target)."""
    kl_target: float = 0.1
    """adaptive: the KL per token, averaged over responses, the coefficient steers towards."""
    kl_horizon: int = 10000
    """adaptive: responses over which a KL off target by 20% or more changes the coefficient by 20%."""
    loss_agg: str = "token_mean"
    """How token losses become one number: `token_mean` over every token of the minibatch (DAPO's),
    `seq_mean_token_mean` (each response's token mean, averaged: GRPO's and GSPO's), `seq_mean_token_sum` (each
    response's token sum, averaged) or `seq_mean_token_sum_norm` (every token's loss summed and divided by the
    responses x rollout.max_new_tokens, a constant: Dr. GRPO's, no length bias)."""
    norm_adv_by_std: bool = True
    """grpo: divide each group's centred rewards by their std; false is Dr. GRPO's advantage (verl's
    norm_adv_by_std_in_grpo)."""
    importance_ratio: str = "token"
    """`token`: PPO's ratio per token; `sequence`: GSPO's, one ratio per response, the geometric mean of its tokens'
    ratios (Zheng et al. 2025), clipped as a whole (GSPO uses clip ratios near 3e-4 and 4e-4: `algorithm=gspo`)."""
    clip_ratio_c: float | None = None
    """Dual-clip PPO (Ye et al. 2020; verl's clip_ratio_c, 3.0 there): a token with a negative advantage loses at
    most clip_ratio_c x |A|, however far its ratio has grown; null: no bound."""
    critic_lr: float = 1.0e-3
    """ppo: learning rate of the critic (a value head on its own copy of the LM)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay of the policy and the critic (verl's default is 0.01)."""
    filter_groups: bool = False
    """Dynamic sampling (DAPO): a prompt whose responses all get the same rule reward teaches nothing; drop it and
    generate for more prompts until each micro-batch is full (`max_generation_rounds` at most)."""
    max_generation_rounds: int = 3
    """filter_groups: rounds of generation per micro-batch at most; a micro-batch still short after them is filled
    with dropped groups (under GRPO they add nothing to the update)."""
    behaviour_logprobs: str = "inference"
    """Where the log-probs of the policy that sampled a response (π_behav of off_policy_correction) come from.
    `inference`: the inference group's scoring of the weights that generated it, which are the proximal policy's
    unless runner.max_staleness > 0 (then the correction weighs staleness alone). `rollout`: the rollout engine's own
    log-probs of the tokens it drew, so that the correction also weighs what the engine's kernels and precision make
    of the same weights against what training's make of them (the rollout-training mismatch; Yao et al. 2025's
    truncated importance sampling with off_policy_correction=truncated_is), logged as `rollout/mismatch_kl`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        algorithm = ALGORITHMS[self.name]
        check_choice("algorithm.behaviour_logprobs", self.behaviour_logprobs, BEHAVIOUR_LOGPROBS)
        rounds = self.max_generation_rounds
        check(rounds >= 1, "algorithm.max_generation_rounds", rounds, "at least 1")
        check(
            not self.filter_groups or self.group_size > 1,
            "algorithm.filter_groups",
            self.filter_groups,
            "false with algorithm.group_size = 1 (a group of one response has nothing to compare)",
        )
        check_choice("algorithm.kl_type", self.kl_type, ("k1", "k2", "low_var_kl"))
        check_choice("algorithm.loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        check_choice("algorithm.importance_ratio", self.importance_ratio, IMPORTANCE_RATIOS)
        check(
            self.norm_adv_by_std or self.name == "grpo",
            "algorithm.norm_adv_by_std",
            self.norm_adv_by_std,
            f"true with algorithm.name={self.name} (only grpo divides by the group's std)",
        )
        check(
            self.clip_ratio_c is None or self.clip_ratio_c > 1,
            "algorithm.clip_ratio_c",
            self.clip_ratio_c,
            "null (no dual clip) or more than 1",
        )
        check(self.kl_coef >= 0, "algorithm.kl_coef", self.kl_coef, "0 or more")
        check_choice("algorithm.kl_ctrl", self.kl_ctrl, KL_CONTROLLERS)
        check(
            self.kl_ctrl == "fixed" or self.kl_in_reward,
            "algorithm.kl_ctrl",
            self.kl_ctrl,
            "fixed; adaptive steers a KL in the reward, which needs algorithm.kl_coef > 0, algorithm.use_kl_loss=false "
            f"and an algorithm.name of {', '.join(n for n, a in ALGORITHMS.items() if a.kl_in_reward)}",
        )
        check(self.kl_target > 0, "algorithm.kl_target", self.kl_target, "positive")
        check(self.kl_horizon >= 1, "algorithm.kl_horizon", self.kl_horizon, "at least 1")
        check(self.critic_lr > 0, "algorithm.critic_lr", self.critic_lr, "positive")
        check(self.weight_decay >= 0, "algorithm.weight_decay", self.weight_decay, "0 or more")
        if algorithm.min_group_size > 1:
            check(
                self.group_size >= algorithm.min_group_size,
                "algorithm.group_size",
                self.group_size,
                f"at least {algorithm.min_group_size}: {self.name} compares each response with the others of its "
                "prompt",
            )

    @property
    def kl_in_reward(self) -> bool:
        """The KL penalty is folded into the token rewards (an algorithm that allows it, without use_kl_loss)."""
        return self.kl_coef > 0 and not self.use_kl_loss and ALGORITHMS[self.name].kl_in_reward

    @property
    def has_critic(self) -> bool:
        """The algorithm trains a critic (ppo): the actor builds one and the estimator reads its values."""
        return ALGORITHMS[self.name].critic

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_coef > 0 and self.use_kl_loss


@dataclass
class MultiTurnConfig:
    """Responses made in turns (verl's `rollout.multi_turn`, `generation.turns`), within rollout.max_new_tokens in all:
    where the model ends a call with `call_end`, the tool's answer goes into the response; where it ends its turn (an
    end token), the interaction's reply does. Either way the policy is not trained on what they wrote, and generation
    goes on after it."""

    tool: Any = None
    """The tool (`rlplace.reasoning.tools.TOOLS`: `calculator`), `package.module:function` or
    `path/to/file.py:function`: (call, extra) -> the text the model reads; or a list of them, each call naming its
    tool (`tools.ToolSet`); null: no tool."""
    max_tool_calls: int = 2
    """Calls per response at most (verl's max_assistant_turns less one); a call beyond them ends the response."""
    call_start: str = "<tool_call>"
    """The text before a call: the call is what the turn wrote after its last call_start (all of it without one)."""
    call_end: str = "</tool_call>"
    """The text that ends a call, one token of the model's vocabulary (Qwen2.5's `</tool_call>` is), checked before
    any worker starts."""
    response_template: str = "<tool_response>{result}</tool_response>"
    """The text appended after a call, `{result}` replaced by the tool's answer; a chat model's tool turn goes here
    (e.g. closing the assistant's turn and opening the next)."""
    max_response_tokens: int = 64
    """A tool response's or a feedback turn's tokens at most (verl's max_tool_response_length); longer ones are cut."""
    interaction: str | None = None
    """What answers each turn the model ends (`rlplace.reasoning.interactions`: `retry`), `package.module:function`
    or `path/to/file.py:function`: (prompt, turns, answer, extra) -> (done, text, score); null: an end token ends the
    response."""
    max_user_turns: int = 1
    """The interaction's replies the model reads at most (verl's max_user_turns); the turn after the last is scored,
    and ends the response."""
    feedback_template: str | None = None
    """The text appended after a turn the model ended, `{feedback}` replaced by the interaction's text; null: the
    model's chat template's user turn and assistant header when prompts are rendered with it, else the text alone."""
    max_concurrent_calls: int = 32
    """Tool calls and interaction replies a rollout rank runs at once, each on a thread of its own
    (`generation.calls`), as verl's agent loop runs them concurrently: a turn whose tool answers over the network or
    from a sandbox waits for its slowest call rather than for all of them in turn. 1: one at a time, for a tool that
    is not thread-safe."""
    call_timeout_s: float = 30.0
    """A tool call or interaction reply still running this many seconds after it started, when its turn waits for it,
    is given up (its thread left to finish on its own). Like one that raises, a given-up tool call is answered
    `error: ...`, which the model reads, and a given-up reply ends the episode; both are counted
    (`rollout/tool_errors`, `rollout/interaction_errors`) and the run goes on."""

    def __post_init__(self) -> None:
        specs = tool_specs(self.tool)
        for spec in specs:
            tool_function(spec)  # refused as written, then a file's path kept absolute for the workers
        self.tool = [absolute(spec) for spec in specs] or None
        if self.interaction is not None:
            check_interaction(self.interaction)
            self.interaction = absolute(self.interaction)
        check(self.max_user_turns >= 1, "rollout.multi_turn.max_user_turns", self.max_user_turns, "at least 1")
        if self.feedback_template is not None:
            check(
                FEEDBACK in self.feedback_template,
                "rollout.multi_turn.feedback_template",
                self.feedback_template,
                f"a text holding {FEEDBACK}, where the interaction's text goes",
            )
        check(self.max_tool_calls >= 1, "rollout.multi_turn.max_tool_calls", self.max_tool_calls, "at least 1")
        calls = self.max_concurrent_calls
        check(calls >= 1, "rollout.multi_turn.max_concurrent_calls", calls, "at least 1")
        check(self.call_timeout_s > 0, "rollout.multi_turn.call_timeout_s", self.call_timeout_s, "positive seconds")
        check(bool(self.call_end), "rollout.multi_turn.call_end", self.call_end, "a token of the model's vocabulary")
        check(
            RESULT in self.response_template,
            "rollout.multi_turn.response_template",
            self.response_template,
            f"a text holding {RESULT}, where the tool's answer goes",
        )
        tokens = self.max_response_tokens
        check(tokens >= 1, "rollout.multi_turn.max_response_tokens", tokens, "at least 1")

    @property
    def enabled(self) -> bool:
        """Responses are made in turns: with a tool, an interaction or both."""
        return self.tool is not None or self.interaction is not None


@dataclass
class GenerationConfig(ComponentConfig):
    """LLM generation: `hf` (transformers with a KV cache) or `vllm` (vLLM's offline engine)."""

    backend: str = "hf"
    """A registered backend (`rlplace.reasoning.generation.backends.BACKENDS`)."""
    max_new_tokens: int = 8
    """Most tokens generated per response."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling, for training and sampled held-out answers: the fewest most likely tokens whose probability
    reaches top_p (1.0: all). The update scores responses under the whole softmax, as verl's and OpenRLHF's do."""
    top_k: int = 0
    """Sample among the top_k most likely tokens only (0 or -1: all)."""
    eval_samples: int = 1
    """Answers per held-out problem: 1 gives `eval/accuracy`; k > 1 (sampled) also `eval/best@k`."""
    eval_temperature: float = 0.0
    """Sampling temperature for held-out answers: 0 is greedy."""
    micro_batch_prompts: int = 8
    """Prompts per micro-batch streamed rollout -> reward -> inference -> actor."""
    tensor_parallel_size: int = 1
    """Rollout ranks that hold one engine between them, its weights and KV cache split by tensor parallelism (vllm):
    the group's ranks form world_size / tensor_parallel_size engine replicas, each generating its share of the
    micro-batches. For a model whose engine does not fit one device."""
    gpu_memory_utilization: float = 0.4
    """vllm on a GPU: the share of device memory the engine may take (it shares the device when collocated)."""
    cuda_graphs: bool = True
    """hf on a GPU: decode with a static KV cache, each step replayed as a CUDA graph (the same tokens as eager
    decoding, without a Python round per layer per token); ignored on CPU and by vllm."""
    compile_step: bool = False
    """hf with cuda_graphs: `torch.compile` the decode step before capturing it (fewer, fused kernels, faster than the
    uncompiled graphs), at the cost of a compile per batch-size bucket (benchmarks/gpu_suite.py, generation section)."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Responses in turns: off unless multi_turn.tool or multi_turn.interaction is set."""

    def __post_init__(self) -> None:
        BACKENDS.check(self.backend)
        check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "at least 1")
        check(self.temperature >= 0, "rollout.temperature", self.temperature, "0 (greedy) or more")
        check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        check(self.top_k >= -1, "rollout.top_k", self.top_k, "0 or -1 (every token), or a number of tokens")
        self.top_k = max(self.top_k, 0)
        check(self.eval_samples >= 1, "rollout.eval_samples", self.eval_samples, "at least 1")
        check(self.eval_temperature >= 0, "rollout.eval_temperature", self.eval_temperature, "0 (greedy) or more")
        check(
            self.eval_samples == 1 or self.eval_temperature > 0,
            "rollout.eval_samples",
            self.eval_samples,
            "1 while rollout.eval_temperature = 0 (greedy answers are all the same; sample with a temperature above 0)",
        )
        check(self.micro_batch_prompts >= 1, "rollout.micro_batch_prompts", self.micro_batch_prompts, "at least 1")
        check(self.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", self.tensor_parallel_size, "at least 1")
        check(
            0 < self.gpu_memory_utilization <= 1,
            "rollout.gpu_memory_utilization",
            self.gpu_memory_utilization,
            "in (0, 1] (a share of the device's memory)",
        )

    @property
    def scoring_temperature(self) -> float:
        """The temperature the update scores responses at: the one they were sampled at (greedy sampling: 1)."""
        return self.temperature or 1.0


LORA_SYNCS = ("merged", "adapters")
"""`actor.lora.sync`: what weight sync sends of an adapted policy."""


@dataclass
class LoRAConfig:
    """Low-rank adapters on the policy and PPO's critic (`rlplace.reasoning.lora`; verl's `model.lora_rank`,
    OpenRLHF's `--lora_rank`): the base weights frozen, gradients and AdamW state for the adapters alone (and the
    critic's value head)."""

    rank: int = 0
    """The adapters' rank r; 0: off (the whole policy trains)."""
    alpha: int = 16
    """Adapters scaled by alpha / rank."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """The linear layers adapted, by name (`[q_proj,v_proj]`), or `[all-linear]`: every linear layer but the output
    head; checked against the model before anything starts."""
    critic: bool = True
    """PPO's critic's backbone gets adapters too (OpenRLHF's `--lora_rank` adapts both models); false: the critic
    trains every weight (verl's default, where `critic.model.lora_rank` is a setting of its own)."""
    sync: str = "merged"
    """What weight sync sends the rollout engines and the inference group: `merged` (each adapted weight merged, W +
    s · B A: the receivers run an ordinary model) or `adapters` (the adapters alone, a few percent of the weights:
    the receivers keep the base and apply them, vLLM through its LoRA support, and the inference group scores the
    reference log-probs with its policy copy's adapters switched off instead of holding a second model)."""

    def __post_init__(self) -> None:
        check(self.rank >= 0, "actor.lora.rank", self.rank, "0 (off) or more")
        check_choice("actor.lora.sync", self.sync, LORA_SYNCS)
        check(self.sync == "merged" or self.enabled, "actor.lora.sync", self.sync, "merged without adapters (rank 0)")
        check(self.alpha > 0, "actor.lora.alpha", self.alpha, "more than 0")
        check(
            bool(self.target_modules), "actor.lora.target_modules", self.target_modules, "layer names or [all-linear]"
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def identity(self, has_critic: bool) -> dict[str, object]:
        """What the adapters are, which a checkpoint's must match: their shape and, where a critic trains every weight
        beside them, `critic: false` (a critic with adapters, the default, is what checkpoints written before the
        choice existed hold, so they still match); not how weight sync sends them."""
        found: dict[str, object] = {"rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules)}
        return {**found, "critic": False} if has_critic and not self.critic else found

    @property
    def sends_adapters(self) -> bool:
        """Weight sync sends the adapters alone (`sync: adapters`)."""
        return self.enabled and self.sync == "adapters"


@dataclass
class ActorConfig(ComponentConfig):
    """How the actor's ranks train the policy (and the critic): replicated or sharded, in which precision, in passes
    of how many tokens."""

    strategy: str = AUTO
    """`ddp` (a full replica per rank, gradients averaged), `fsdp` (FSDP2: parameters, gradients and optimizer state
    sharded over the ranks; `rlplace.core.strategies.STRATEGIES`), or `auto`: fsdp with several ranks on GPUs or with
    bf16, else ddp. The inference group holds its policy copy and reference model the same way (over its own
    ranks, `auto` resolved for their count)."""
    dtype: str = "fp32"
    """`fp32`, or `bf16`: forward and backward in bfloat16 over float32 master weights, optimizer and gradient
    reduction (fsdp's mixed precision)."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input during the forward pass and recompute the rest in the backward pass:
    activation memory for about a third more compute."""
    max_tokens_per_micro_batch: int | None = None
    """Cut each optimizer step's rows into forward/backward passes of at most this many (padded) tokens, shortest
    rows together (`rlplace.reasoning.micro_batches`); None: one pass per optimizer step."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """Train low-rank adapters instead of the whole policy; off unless lora.rank is set."""

    def __post_init__(self) -> None:
        check_choice("actor.strategy", self.strategy, (AUTO, *STRATEGIES.names()))
        check_choice("actor.dtype", self.dtype, DTYPES)
        if self.strategy != AUTO:
            allowed = STRATEGIES[self.strategy].dtypes
            check(
                self.dtype in allowed,
                "actor.dtype",
                self.dtype,
                f"valid with actor.strategy={self.strategy}: {', '.join(allowed)} (bf16 needs fsdp's mixed precision)",
            )
        budget = self.max_tokens_per_micro_batch
        check(budget is None or budget >= 1, "actor.max_tokens_per_micro_batch", budget, "null or at least 1")

    def strategy_for(self, world_size: int, on_gpu: bool) -> str:
        """The strategy a group of `world_size` ranks holds the policy by (the actor's, the inference group's):
        `strategy`, with `auto` resolved for that many ranks."""
        return resolve(self.strategy, self.dtype, world_size, on_gpu)


@dataclass
class InferenceConfig(ComponentConfig):
    """The inference group's section (`conf/inference/reasoning.yaml`, chosen by the reasoning experiments): whether
    it leaves devices it shares while the actor trains (placement presets set it), and how many tokens a forward pass
    scores. It holds the policy as the actor's ranks do (`actor.strategy`, `actor.dtype`), so it has no model settings
    of its own; moving it out and back each step costs its copy of the policy and, with a KL term, the reference
    model."""

    max_tokens_per_micro_batch: int | None = None
    """A forward pass's tokens at most (verl's log_prob_max_token_len_per_gpu): a micro-batch's rows are scored
    shortest first, a pass as wide as its longest row, as many rows as fit (one at least; `micro_batches`), which
    bounds the logits a pass holds (a vocabulary's width per token) whatever rollout.max_new_tokens is; null: 64 rows
    a pass (`streams.SCORING_ROWS`), each as wide as the micro-batch."""

    def __post_init__(self) -> None:
        budget = self.max_tokens_per_micro_batch
        check(budget is None or budget >= 1, "inference.max_tokens_per_micro_batch", budget, "null or at least 1")


@dataclass
class RewardConfig(ComponentConfig):
    """How the reward workers score a response (`rlplace.reasoning.rewards`): a section of its own rather than a task
    field, so that one task's data can be scored in several ways, and the `reward` component's section (a reward
    model takes device memory, offloaded between phases as the other groups are)."""

    function: str | None = None
    """A registered reward (`rlplace.reasoning.rewards.REWARDS`: exact_match, gsm8k, boxed, format,
    gsm8k_with_format, ...), `package.module:function`, or `path/to/file.py:function` (a relative path is from the
    directory the run starts in; on several nodes the file must be at that path on each); a function receives
    (prompt, response, answer, extra) and returns a float or a dict of floats with the training reward under "score".
    None: the task's default (`default_reward` of its schema; arithmetic: exact_match)."""

    enable_offload: bool = True
    """With model_path: move the reward model off devices it shares with a working group (the actor while it trains),
    as the switch plan does for the other groups. On by default, unlike theirs (which placement presets set): a reward
    model only scores, so moving it costs its weights alone, and nothing moves without a shared device. Placement
    presets of both families leave this section alone, so that an embodied run is not given one."""
    model_path: str | None = None
    """A reward model, a Hugging Face folder of an `AutoModelForSequenceClassification` with num_labels=1, scoring
    each prompt and response on the reward workers' devices (`rlplace.reasoning.models.reward_model`); None: the rule
    reward alone."""
    model_weight: float = 1.0
    """With model_path: the model's share of the training reward, (1 - w) x the rule's score + w x the model's (1.0:
    the model alone; the rule's score is still logged as `reward/rule`, and `eval/accuracy` is always the rule's)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment (verl's `overlong_buffer.len`): a training response longer than
    rollout.max_new_tokens minus this many tokens loses `overlong_penalty` x its share of the buffer it ran into,
    logged as `reward/overlong_penalty` (`rewards.with_overlong_penalty`); 0: off. Held-out answers are not
    penalised."""
    overlong_penalty: float = 1.0
    """With overlong_buffer: the penalty of a response that runs to rollout.max_new_tokens."""
    interaction_weight: float = 1.0
    """With rollout.multi_turn.interaction: the weight of the interaction's scores, summed over a response's turns and
    added to its training reward (logged as `reward/interaction`); 0 matches verl, whose reward function alone scores
    a response."""

    def __post_init__(self) -> None:
        check(self.overlong_buffer >= 0, "reward.overlong_buffer", self.overlong_buffer, "0 (off) or more tokens")
        check(self.overlong_penalty >= 0, "reward.overlong_penalty", self.overlong_penalty, "0 or more")
        if self.function is not None:
            reward_function(self.function)  # refused as written, then a file's path kept absolute for the workers
            self.function = absolute(self.function)
        check(0 <= self.model_weight <= 1, "reward.model_weight", self.model_weight, "in [0, 1]")
        check(self.interaction_weight >= 0, "reward.interaction_weight", self.interaction_weight, "0 or more")


@dataclass
class ReasoningConfig(RunConfig):
    """A whole reasoning run."""

    components: ClassVar[tuple[str, ...]] = COMPONENTS
    """Its worker groups, for the placement (`HybridComponentPlacement(cfg)`)."""

    task: ReasoningTaskConfig = field(default_factory=ArithmeticTaskConfig)
    """Typed by the chosen task's own schema (`rlplace.reasoning.tasks.TASKS`)."""
    model: LMConfig = field(default_factory=LMConfig)
    algorithm: ReasoningAlgorithmConfig = field(default_factory=ReasoningAlgorithmConfig)
    rollout: GenerationConfig = field(default_factory=GenerationConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)

    @property
    def offloadable(self) -> dict[str, bool]:
        """The components the switch plan may move off shared devices (a rule reward holds no device memory)."""
        return {
            "actor": self.actor.enable_offload,
            "rollout": self.rollout.enable_offload,
            "inference": self.inference.enable_offload,
            "reward": self.reward.enable_offload and self.reward.model_path is not None,
        }

    def with_offload(self, offload: Mapping[str, bool]) -> ReasoningConfig:
        """This run with the offload switches of `offload` (components of OFFLOAD_SWITCHES) set as given."""
        return replace(self, **{name: replace(getattr(self, name), enable_offload=on) for name, on in offload.items()})

    @property
    def reward_name(self) -> str:
        """`reward.function`, or the task's default reward when it is not set."""
        return self.task.default_reward if self.reward.function is None else self.reward.function

    def reward_function(self) -> RewardFunction:
        """The reward every part of the run scores with (the reward workers, evaluation, pretraining)."""
        return reward_function(self.reward_name)
