"""InferenceWorker: log-probs of the generated responses under the current policy and the reference model.

The old log-probs are recomputed here with the training model's own forward pass rather than taken from the
engine (vLLM's kernels differ from training's in the last bits), so the PPO ratio starts at exactly 1 for the
current weights. The reference model is the starting checkpoint, frozen; it is loaded only when
`algorithm.kl_coef > 0`, and not at all when the actor sends LoRA adapters alone (`actor.lora.sync: adapters`): the
policy copy then holds the base weights and the adapters, and scores the reference with the adapters off. The policy
copy receives the actor's weights each step, as the rollout does, so its log-probs are always those of the weights
that generated the responses: with runner.max_staleness > 0 they are the behaviour policy's, which the actor weighs
its update by.

The ranks hold both models as the actor's ranks hold the policy (`actor.strategy` and `actor.dtype`, `auto` resolved
for this group's rank count): a full copy each (ddp), or under fsdp a shard each, gathered one unit at a time for a
forward pass, so that a model too large for one device is scored as it is trained, at the actor's precision. A
micro-batch is scored in passes of 64 rows, or of about `inference.max_tokens_per_micro_batch` tokens. Sharded forward
passes are collective: a rank with fewer passes than another in a round runs passes on one token to keep in step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import NamedTuple

import torch

from rlplace.core.data_parallel import most_over_ranks
from rlplace.core.offload import HostCopies, move
from rlplace.core.strategies.base import build_strategy
from rlplace.core.weights import receive_weights
from rlplace.reasoning import lora
from rlplace.reasoning.batch import SequenceBatch, response_logprobs, scoring_passes
from rlplace.reasoning.config import LoRAConfig, ReasoningConfig
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.streams import consumer_key, micro_batches_of
from rlplace.scheduler import Channel, Worker, timer


class InferenceWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, actor_world_size: int) -> None:
        self.cfg = cfg
        self.actor_world_size = actor_world_size
        name = cfg.actor.strategy_for(self.world_size, self.device.type == "cuda")
        self.strategy = build_strategy(name, self.world_size, self.device, cfg.actor.dtype)
        if self.strategy.collective_passes:
            self.init_process_group()
        adapters = cfg.actor.lora if cfg.actor.lora.sends_adapters else None
        self.policy = self._frozen(model_path, adapters)
        self.shared_reference = adapters is not None and bool(cfg.algorithm.kl_coef)
        """The reference is the policy copy with its adapters off (`sync: adapters`), not a model of its own."""
        self.reference = self._frozen(model_path) if cfg.algorithm.kl_coef and adapters is None else None
        self.host_copies = HostCopies()
        self.version = 0

    @timer("sync_weights")
    def sync_weights(self) -> int:
        self.version = receive_weights(self, self.policy, src_group="actor")
        return self.version

    def compute_logprobs(self, num_micro_batches: int, inbox: Channel, out: Channel) -> int:
        """Old (and reference) log-probs for this rank's micro-batches as they arrive on `inbox`, passed on to the
        actor through `out`; returns how many. Sharded, the ranks' forward passes are collective: they score in rounds
        (`score_round`), as many as the rank with the most micro-batches has."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        most = None
        rounds = len(mine)
        if self.strategy.collective_passes:
            most = self._most
            rounds = len(micro_batches_of(0, self.world_size, num_micro_batches))
        temperature, budget = self.cfg.rollout.scoring_temperature, self.cfg.inference.max_tokens_per_micro_batch
        for round_ in range(rounds):
            batch: SequenceBatch | None = inbox.get(key=f"inference{self.rank}") if round_ < len(mine) else None
            with self.span("inference") if batch is not None else contextlib.nullcontext():
                score_round(self._scorers(), batch, temperature, budget, most, self.device)
            if batch is not None:
                out.put(batch, key=consumer_key("actor", batch.index, self.actor_world_size))
        return len(mine)

    def _most(self, passes: int) -> int:
        """The most passes any rank of the group runs this round (every rank asks at once)."""
        (most,) = most_over_ranks([passes], self.rank, self.world_size, self.sum_over_group)
        return most

    def _scorers(self) -> list[Scorer]:
        """What scores a micro-batch, in order: the policy copy, then the reference model (or the copy with its
        adapters off)."""
        scorers = [Scorer("old_logprobs", self.policy)]
        if self.shared_reference:
            scorers.append(Scorer("ref_logprobs", self.policy, adapters_off=True))
        elif self.reference is not None:
            scorers.append(Scorer("ref_logprobs", self.reference))
        return scorers

    def _frozen(self, model_path: str, adapters: LoRAConfig | None = None) -> torch.nn.Module:
        """The model of `model_path`, with `adapters` added (`lora.inject`) where given, wrapped as the strategy holds
        it, for scoring alone."""
        model = load_causal_lm(model_path, self.device)
        if adapters is not None:
            model = lora.inject(model, adapters)
        return self.strategy.wrap(model.requires_grad_(False).eval(), trained=False)

    @timer("offload")
    def offload(self) -> int:
        return sum(move(m, None, torch.device("cpu"), self.host_copies).bytes for m in self._models())

    @timer("onload")
    def onload(self) -> int:
        return sum(move(m, None, self.device, self.host_copies).bytes for m in self._models())

    def _models(self) -> list[torch.nn.Module]:
        return [m for m in (self.policy, self.reference) if m is not None]


class Scorer(NamedTuple):
    """A model that scores micro-batches into one of their log-prob fields."""

    field: str
    """`old_logprobs` or `ref_logprobs`."""
    model: torch.nn.Module
    adapters_off: bool = False
    """Score with the model's LoRA adapters off (the reference of `actor.lora.sync: adapters`)."""


def score_round(
    scorers: list[Scorer],
    batch: SequenceBatch | None,
    temperature: float,
    max_tokens: int | None,
    most: Callable[[int], int] | None,
    device: torch.device,
) -> None:
    """Fill `batch`'s log-prob fields, each scorer's in turn, in the passes `scoring_passes` cuts (None: this rank has
    no micro-batch this round). Sharded passes are collective, every rank running each model's as often as the others
    do: `most` turns this rank's pass count into the most of any rank's this round (None: not sharded), and the
    passes this rank lacks run on one token (`keep_in_step`)."""
    passes = [] if batch is None else scoring_passes(batch, max_tokens)
    padding = 0 if most is None else most(len(passes)) - len(passes)
    for scorer in scorers:
        with lora.without_adapters(scorer.model) if scorer.adapters_off else contextlib.nullcontext():
            if batch is not None:
                setattr(batch, scorer.field, response_logprobs(scorer.model, batch, temperature, passes))
            keep_in_step(scorer.model, padding, device)


@torch.no_grad()
def keep_in_step(model: torch.nn.Module, passes: int, device: torch.device) -> None:
    """`passes` forward passes of sharded `model` on one token: each gathers the model's units from every rank, as a
    pass of the ranks that have rows to score does, and computes nothing anyone reads."""
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(passes):
        model(input_ids=token)
