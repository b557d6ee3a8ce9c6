"""RewardWorker: scores responses with the function `reward.function` names (`rlplace.reasoning.rewards`).

It is its own group so that a costly verifier (a code sandbox, a reward model) can be placed like any other
component; the arithmetic verifier is cheap, and one CPU-side rank is plenty.
"""

from __future__ import annotations

import torch

from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.models.tiny_lm import load_tokenizer
from rlplace.reasoning.rewards import METRIC_PREFIX, SCORE, RewardFunction
from rlplace.reasoning.streams import consumer_key, micro_batches_of
from rlplace.scheduler import Channel, Worker


class RewardWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, inference_world_size: int) -> None:
        self.cfg = cfg
        self.inference_world_size = inference_world_size
        self.tokenizer = load_tokenizer(model_path)
        self.reward = cfg.reward_function()  # not the task's problems: the batch carries its own

    def compute_rewards(self, num_micro_batches: int, inbox: Channel, out: Channel) -> int:
        """Score this rank's micro-batches of the step as they arrive on `inbox` and pass them on through `out`;
        returns how many."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        for _ in mine:
            batch: SequenceBatch = inbox.get(key=f"reward{self.rank}")
            with self.span("reward"):
                score(self.reward, self.tokenizer, batch)
            out.put(batch, key=consumer_key("inference", batch.index, self.inference_world_size))
        return len(mine)


def score(reward: RewardFunction, tokenizer, batch: SequenceBatch) -> None:
    """Fill `batch.rewards` ([B], the "score" of each decoded response) and the sums of every named score over the
    rows (`batch.meta["reward/<name>"]`)."""
    texts = tokenizer.batch_decode(batch.responses, skip_special_tokens=True)
    scores = reward.scores(batch.problems, texts)
    batch.rewards = torch.tensor([s[SCORE] for s in scores])
    for name in scores[0]:
        batch.meta[METRIC_PREFIX + name] = sum(s[name] for s in scores)
