"""LLMActorWorker: the policy update of reasoning tasks (and the critic's, for PPO), data-parallel over ranks.

Each rank trains on the micro-batches routed to it (m % world_size == rank); gradients are averaged over ranks
before every optimizer step, and minibatches are drawn over the step's global batch by a generator seeded identically
everywhere, so any rank count trains the same update (`core.data_parallel`). `actor.strategy` says how the ranks hold
the models (`rlplace.core.strategies`): a full replica each (ddp) or a shard each (fsdp). Either way the rollout and
inference groups receive full tensors, gathered bucket by bucket (`core.weights`), checkpoints hold every rank's part
(`torch.distributed.checkpoint`, resumable under another rank count and strategy), and rank 0 writes the final model
as an ordinary Hugging Face folder. With `actor.lora.rank` the policy trains low-rank adapters over frozen weights
(`reasoning.lora`), and what leaves the actor (weight sync, the final model) has them merged, or weight sync sends
them alone (`actor.lora.sync: adapters`).

With runner.max_staleness = K > 0 a rank holds up to K steps' micro-batches received and not yet trained on
(`pending`, part of its checkpoint). Their old log-probs are the behaviour policy's (the inference worker computed
them with the weights that generated the responses); before training on a batch the actor scores it again with its
own weights, the proximal policy, and the update weighs each token by π_prox / π_behav (`llm_update`).
"""

from __future__ import annotations

import shutil
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlplace.core.data_parallel import Shard
from rlplace.core.lr_schedule import lr_factor
from rlplace.core.offload import HostCopies, move
from rlplace.core.pending import load_pending, save_pending
from rlplace.core.rng import rng_states, set_rng_states
from rlplace.core.strategies.base import build_strategy
from rlplace.core.strategies.training_state import load_training_state, save_training_state
from rlplace.core.timing import median_seconds
from rlplace.core.weights import broadcast_weights
from rlplace.reasoning import lora
from rlplace.reasoning.advantages import adaptive_kl_coef
from rlplace.reasoning.batch import SequenceBatch, response_logits, response_logprobs
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.losses import kl_divergence
from rlplace.reasoning.models.hf_folder import copy_without_weights
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.models.value_model import ValueModel
from rlplace.reasoning.rewards import METRIC_PREFIX
from rlplace.reasoning.streams import MISMATCH_KL, micro_batches_of
from rlplace.reasoning.update import compute_advantages, llm_update, optimizer_step, reward_kl
from rlplace.scheduler import Channel, Worker, timer

STATE_FILE = "actor.pt"
"""The actor's counters in a checkpoint folder: the minibatch generator, the RNG states, the weight version and the
KL coefficient."""
PROFILE_REPEATS = 5
"""Timed calls per size of `profile_passes`: the same on every rank (they are collective), a median of five."""
MODELS_DIR = "actor"
"""The actor's models and optimizers in a checkpoint folder, every rank's part (`training_state`)."""
MODEL_FILES_DIR = "model"
"""The model folder's files but its weights, in a checkpoint folder (`rlplace.reasoning.export`)."""


class LLMActorWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str) -> None:
        self.cfg = cfg
        self.model_path = model_path
        torch.manual_seed(cfg.runner.seed)
        actor, alg = cfg.actor, cfg.algorithm
        name = actor.strategy_for(self.world_size, self.device.type == "cuda")
        self.strategy = build_strategy(name, self.world_size, self.device, actor.dtype, self.average_over_group)
        if self.world_size > 1 or self.strategy.collective_passes:
            self.init_process_group()
        self.model = load_causal_lm(model_path, self.device)
        """The policy's Hugging Face model, which writes the final model folder (`self.policy` is it, or its LoRA
        wrapper)."""
        self.policy = self._trainable(lora.adapt(self.model, actor.lora))
        self.export = lora.export(self.policy, actor.lora.sends_adapters)
        """How the policy's weights leave the actor: None as they are, with its adapters merged, or the adapters
        alone (`actor.lora.sync: adapters`)."""
        self.optimizer = torch.optim.AdamW(lora.trained(self.policy), lr=alg.lr, weight_decay=alg.weight_decay)
        self.critic: ValueModel | None = None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if alg.has_critic:
            critic = lora.adapt_critic(ValueModel.from_pretrained(model_path).to(self.device), actor.lora)
            self.critic = self._trainable(critic)
            self.critic_optimizer = torch.optim.AdamW(
                lora.trained(self.critic), lr=alg.critic_lr, weight_decay=alg.weight_decay
            )
        self.host_copies = HostCopies()
        self.generator = torch.Generator().manual_seed(cfg.runner.seed)
        self.version = 0
        self.pending: deque[list[SequenceBatch]] = deque()
        """This rank's micro-batches of each step received and not yet trained on, oldest step first: one step's when
        synchronous, up to K steps' with runner.max_staleness = K."""
        self.batch: SequenceBatch | None = None
        self.behaviour_logprobs: torch.Tensor | None = None
        self.shard: Shard | None = None
        """Where the batch's rows lie in the step's global batch, with more than one rank."""
        self.advantages: torch.Tensor | None = None
        self.returns: torch.Tensor | None = None
        self.old_values: torch.Tensor | None = None
        self.kl_coef = alg.kl_coef
        """The coefficient of a KL in the reward for the next step: algorithm.kl_coef, moved after every step under
        algorithm.kl_ctrl = adaptive."""
        self.kl_stats: dict[str, float] = {}
        """train/kl_coef and train/reward_kl of the batch's advantages, with a KL in the reward."""

    def _trainable(self, model: nn.Module) -> nn.Module:
        """`model` in train mode, with activation checkpointing per decoder layer if asked, under the strategy."""
        if self.cfg.actor.gradient_checkpointing:
            for part in model.modules():
                if getattr(part, "supports_gradient_checkpointing", False):
                    part.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                    break
        return self.strategy.wrap(model.train())

    @timer("sync_weights")
    def sync_weights(self, receivers: tuple[str, ...]) -> int:
        """Rank 0 broadcasts the policy's weights and version to every rank of the `receivers` groups (rollout and
        inference; the rollout alone in a run that only evaluates), in buckets (each gathered from every rank's
        shards when they are sharded)."""
        for group in receivers:
            broadcast_weights(
                self, self.policy, self.version, group, self.cfg.weight_sync.bucket_mb, export=self.export
            )
        return self.version

    def recv_batch(self, num_micro_batches: int, inbox: Channel) -> dict[str, float]:
        """Collect this rank's micro-batches of one step from `inbox`, queued behind those not trained on yet; returns
        the sums the step's generation throughput needs (response tokens, generation seconds). Not timed as a whole:
        it mostly waits for the stages before it."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        parts = [inbox.get(key=f"actor{self.rank}") for _ in mine]
        self.pending.append(parts)
        return {
            "response_tokens": float(sum(part.action_mask.sum() for part in parts)),
            "generate_seconds": sum(part.meta["generate_seconds"] for part in parts),
        }

    @timer("advantages")
    def compute_advantages(self) -> dict[str, float]:
        """Take the oldest step received; the behaviour policy's log-probs (the rollout engine's, with
        algorithm.behaviour_logprobs=rollout, or the inference group's under runner.max_staleness > 0) and then the
        proximal ones (with runner.max_staleness > 0, this rank's own); values from the critic (PPO); then the
        algorithm's token-level advantages. Returns the sums of the batch's rollout metrics (rows, rewards, response
        tokens, each named score of the reward, `reward/<name>`, and the rollout-training mismatch)."""
        assert self.pending, "recv_batch must run first"
        parts = self.pending.popleft()
        self.batch = batch = SequenceBatch.concat(parts)
        mismatch: dict[str, float] = {}
        self.behaviour_logprobs = None
        if batch.rollout_logprobs is not None:  # algorithm.behaviour_logprobs: rollout
            mismatch[MISMATCH_KL] = mismatch_kl(batch)
            self.behaviour_logprobs = batch.rollout_logprobs
        if self.cfg.runner.max_staleness:  # generated by an older policy: the proximal one is this rank's own
            if self.behaviour_logprobs is None:
                self.behaviour_logprobs = batch.old_logprobs
            batch.old_logprobs = response_logprobs(self.policy, batch, self.cfg.rollout.scoring_temperature)
        if self.critic is not None:
            with torch.no_grad():
                self.old_values = self.critic.response_values(batch).cpu()
        self.shard = None
        if self.world_size > 1:
            self.shard = self._shard(parts)
        sum_over_ranks = None if self.shard is None else self.shard.sum_over_ranks
        alg = replace(self.cfg.algorithm, kl_coef=self.kl_coef)
        self.advantages, self.returns = compute_advantages(batch, alg, self.old_values, sum_over_ranks)
        if alg.kl_in_reward:
            kl, responses = reward_kl(batch, alg, sum_over_ranks)
            self.kl_stats = {"train/kl_coef": self.kl_coef, "train/reward_kl": kl}
            if alg.kl_ctrl == "adaptive":
                self.kl_coef = adaptive_kl_coef(self.kl_coef, kl, alg.kl_target, alg.kl_horizon, responses)
        assert batch.rewards is not None
        return {
            "rows": float(batch.num_rows),
            "reward_sum": float(batch.rewards.sum()),
            "response_tokens": float(batch.action_mask.sum()),
            **{name: total for name, total in batch.meta.items() if name.startswith((METRIC_PREFIX, "rollout/"))},
            **mismatch,
        }

    @timer("training")
    def run_training(self, step: int) -> dict[str, float]:
        """One policy (and critic) update on this rank's batch; returns train/* stats.

        The learning rate follows `core.lr_schedule`; the presets' `anneal_lr` decays it linearly to 0 over
        `runner.max_steps`: late updates then refine instead of undoing what earlier ones learned, which steadies the
        accuracy a run ends with.
        """
        assert self.batch is not None and self.advantages is not None, "compute_advantages must run first"
        alg = self.cfg.algorithm
        factor = lr_factor(alg, step, self.cfg.runner.max_steps)
        for optimizer, lr in ((self.optimizer, alg.lr), (self.critic_optimizer, alg.critic_lr)):
            for group in optimizer.param_groups if optimizer is not None else []:
                group["lr"] = lr * factor
        stats = llm_update(
            self.policy,
            self.optimizer,
            self.batch,
            self.advantages,
            alg,
            self.generator,
            critic=self.critic,
            critic_optimizer=self.critic_optimizer,
            returns=self.returns,
            old_values=self.old_values,
            behaviour_logprobs=self.behaviour_logprobs,
            strategy=self.strategy,
            shard=self.shard,
            max_tokens_per_micro_batch=self.cfg.actor.max_tokens_per_micro_batch,
            max_response_tokens=self.cfg.rollout.max_new_tokens,
            temperature=self.cfg.rollout.scoring_temperature,
        )
        self.version += 1
        stats["async/staleness"] = float(step - self.batch.version)
        return stats | self.kl_stats

    def profile_passes(self, sizes: list[int], repeats: int = PROFILE_REPEATS) -> dict[str, Any]:
        """After the run (`runner.profile`): median seconds of one training pass of the policy (forward and backward,
        as a minibatch's last pass runs it, reducing the gradients where the strategy does that in the backward pass)
        over n rows of this rank's last batch, for each n in `sizes` (its rows repeated where n is more), and of one
        optimizer step; and its rows' mean tokens. Every rank calls it at once, with the same sizes and repeats: the
        passes and steps of several ranks are collective. It changes the weights; the final model and the
        checkpoints are written before."""
        assert self.batch is not None, "the run must have trained"
        batch = self.batch
        width = batch.prompts.shape[1]
        self.policy.train()

        def one_pass(rows: torch.Tensor) -> None:
            self.optimizer.zero_grad()
            self.strategy.sync_grads(self.policy, True)
            logits = response_logits(self.policy, batch.input_ids[rows], batch.attention_mask[rows], width)
            logits.float().mean().backward()

        passes = [median_seconds(lambda n=n: one_pass(torch.arange(n) % batch.num_rows), repeats) for n in sizes]
        step = median_seconds(lambda: optimizer_step(self.policy, self.optimizer, 1.0, self.strategy), repeats)
        row_tokens = float(batch.attention_mask.sum()) / batch.num_rows
        return {"sizes": list(sizes), "seconds": passes, "optimizer_step": step, "row_tokens": row_tokens}

    def _shard(self, parts: list[SequenceBatch]) -> Shard:
        """Where this rank's rows (its micro-batches, concatenated in index order as `SequenceBatch.concat` does) lie
        in the step's global batch (every micro-batch's rows in index order), so that every rank count trains the
        same update."""
        rows = self.cfg.rollout.micro_batch_prompts * self.cfg.algorithm.group_size
        num_micro_batches = self.cfg.task.prompts_per_step // self.cfg.rollout.micro_batch_prompts
        ordered = sorted(parts, key=lambda part: part.index)
        index = torch.cat([part.index * rows + torch.arange(part.num_rows) for part in ordered])
        return Shard(index, num_micro_batches * rows, self.world_size, self.sum_over_group, self.rank)

    def _trained(self) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
        parts: dict[str, tuple[nn.Module, torch.optim.Optimizer]] = {"policy": (self.policy, self.optimizer)}
        if self.critic is not None and self.critic_optimizer is not None:
            parts["critic"] = (self.critic, self.critic_optimizer)
        return parts

    def save_checkpoint(self, folder: str) -> None:
        """Every rank writes its part of the policy (and critic) with their optimizers into `folder/actor`, and its
        pending micro-batches (asynchronous training) to `pending/<rank>.pt`; rank 0 writes the minibatch generator,
        the process's RNG states and the weight version, which every rank holds alike. A resumed update then shuffles,
        steps and draws exactly as the uninterrupted one would. Rank 0 also copies the model folder's files but its
        weights (config, tokenizer) into `folder/model`, with which `rlplace-export` makes the checkpoint a model
        folder again."""
        save_pending(folder, self.rank, self.pending)
        save_training_state(Path(folder) / MODELS_DIR, self._trained())
        if self.rank == 0:
            state = {
                "generator": self.generator.get_state(),
                "rng": rng_states(),
                "version": self.version,
                "kl_coef": self.kl_coef,
            }
            torch.save(state, Path(folder) / STATE_FILE)
            copy_without_weights(self.model_path, Path(folder) / MODEL_FILES_DIR)

    def load_checkpoint(self, folder: str) -> None:
        """Every rank reads its part of the models and optimizers, whichever rank count and strategy wrote them, the
        counters rank 0 wrote, and the pending micro-batches it trains on now, whichever ranks wrote them."""
        load_training_state(Path(folder) / MODELS_DIR, self._trained())
        state = torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=False)
        self.generator.set_state(state["generator"])
        set_rng_states(state["rng"])
        self.version = state["version"]
        self.kl_coef = state.get("kl_coef", self.kl_coef)  # none in checkpoints of versions with a fixed coefficient
        num_micro_batches = self.cfg.task.prompts_per_step // self.cfg.rollout.micro_batch_prompts
        mine = set(micro_batches_of(self.rank, self.world_size, num_micro_batches))
        self.pending = deque(
            [part for parts in step for part in parts if part.index in mine] for step in load_pending(folder)
        )

    def save_model(self, folder: str) -> None:
        """Rank 0 writes the policy and tokenizer as a Hugging Face folder, atomically (temporary folder, rename),
        its weights gathered from every rank's shards on the CPU (LoRA adapters merged into them, and kept alone
        beside them: `lora.save_model`)."""
        state = self.strategy.full_state_dict(self.policy)
        if self.rank != 0:
            return
        final = Path(folder)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        lora.save_model(self.model, self.policy, state, tmp)
        load_tokenizer(self.model_path).save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)

    @timer("offload")
    def offload(self) -> int:
        moved = move(self.policy, self.optimizer, torch.device("cpu"), self.host_copies).bytes
        if self.critic is not None:
            moved += move(self.critic, self.critic_optimizer, torch.device("cpu"), self.host_copies).bytes
        return moved

    @timer("onload")
    def onload(self) -> int:
        moved = move(self.policy, self.optimizer, self.device, self.host_copies).bytes
        if self.critic is not None:
            moved += move(self.critic, self.critic_optimizer, self.device, self.host_copies).bytes
        return moved


def mismatch_kl(batch: SequenceBatch) -> float:
    """The sum over `batch`'s responses of each one's mean per-token KL(rollout engine || inference group) (k3, from
    the engine's samples), both of the weights that generated it: what the engine's kernels and precision make of the
    policy against what training's make of it."""
    assert batch.rollout_logprobs is not None and batch.old_logprobs is not None
    # In float64: where the two agree to float32's last bits, k3 (about half the squared difference) is smaller than
    # the rounding of exp(x) - x - 1 in float32.
    tokens = kl_divergence(batch.rollout_logprobs.double(), batch.old_logprobs.double(), "low_var_kl")
    mask = batch.action_mask
    return float(((tokens * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum())
