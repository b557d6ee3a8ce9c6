"""RewardWorker: scores responses with the function `reward.function` names (`rlplace.reasoning.rewards`), joined with
a reward model's score when `reward.model_path` is set.

It is its own group so that a costly scorer (a reward model, a code sandbox) can be placed like any other component:
a reward model holds device memory in the generation phase only, and with `reward.enable_offload` (the default) the
switch plan moves it off the devices it shares with the actor while the actor trains, as it does the rollout's engine.
The arithmetic verifier is cheap, and one CPU-side rank is plenty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rlplace.core.offload import HostCopies, move
from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.models.tokenizer import load_tokenizer
from rlplace.reasoning.rewards import (
    METRIC_PREFIX,
    SCORE,
    Scores,
    with_interaction,
    with_model,
    with_overlong_penalty,
)
from rlplace.reasoning.streams import consumer_key, micro_batches_of
from rlplace.scheduler import Channel, Worker, timer

if TYPE_CHECKING:
    from rlplace.reasoning.models.reward_model import RewardModel


class RewardWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, inference_world_size: int) -> None:
        self.cfg = cfg
        self.inference_world_size = inference_world_size
        self.tokenizer = load_tokenizer(model_path)
        self.reward = cfg.reward_function()  # not the task's problems: the batch carries its own
        self.model = None if cfg.reward.model_path is None else self.load_model(cfg.reward.model_path)
        self.host_copies = HostCopies()

    def load_model(self, path: str) -> RewardModel:
        # Imported here: a rule-only reward process must not import transformers' model classes (seconds of
        # start-up in every reward process; see models/tokenizer.py).
        from rlplace.reasoning.models.reward_model import RewardModel

        return RewardModel(path, self.device)

    def compute_rewards(self, num_micro_batches: int, inbox: Channel, out: Channel) -> int:
        """Score this rank's micro-batches of the step as they arrive on `inbox` and pass them on through `out`;
        returns how many."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        for _ in mine:
            batch: SequenceBatch = inbox.get(key=f"reward{self.rank}")
            with self.span("reward"):
                record(batch, self.score(batch))
            out.put(batch, key=consumer_key("inference", batch.index, self.inference_world_size))
        return len(mine)

    def score(self, batch: SequenceBatch) -> list[Scores]:
        """The named scores of each decoded response: the rule reward's, joined with the reward model's if any, the
        interaction's (`rollout.multi_turn.interaction`), and the overlong penalty with reward.overlong_buffer."""
        response_ids = batch.response_ids()
        decoded = self.reward.decode(self.tokenizer, batch.prompt_ids(), response_ids)
        scores = self.reward.scores(batch.problems, decoded)
        if self.model is not None:
            weight = self.cfg.reward.model_weight
            model = self.model.score(batch.problems, decoded.responses)
            scores = [with_model(rule, m, weight) for rule, m in zip(scores, model, strict=True)]
        reward = self.cfg.reward
        if batch.interaction_scores is not None:
            pairs = zip(scores, batch.interaction_scores.tolist(), strict=True)
            scores = [with_interaction(s, interaction, reward.interaction_weight) for s, interaction in pairs]
        if reward.overlong_buffer:
            width, buffer, factor = self.cfg.rollout.max_new_tokens, reward.overlong_buffer, reward.overlong_penalty
            pairs = zip(scores, response_ids, strict=True)
            scores = [with_overlong_penalty(s, len(ids), width, buffer, factor) for s, ids in pairs]
        return scores

    @timer("offload")
    def offload(self) -> int:
        return 0 if self.model is None else move(self.model.model, None, torch.device("cpu"), self.host_copies).bytes

    @timer("onload")
    def onload(self) -> int:
        return 0 if self.model is None else move(self.model.model, None, self.device, self.host_copies).bytes


def record(batch: SequenceBatch, scores: list[Scores]) -> None:
    """Fill `batch.rewards` ([B], each response's "score") and the sums of every named score over the rows
    (`batch.meta["reward/<name>"]`)."""
    batch.rewards = torch.tensor([s[SCORE] for s in scores])
    for name in scores[0]:
        batch.meta[METRIC_PREFIX + name] = sum(s[name] for s in scores)
