"""RewardWorker: scores responses with the task's reward (`task.reward`, the function the task's `score` calls too).

It is its own group so that a costly verifier (a code sandbox, a reward model) can be placed like any other
component; the arithmetic verifier is cheap, and one CPU-side rank is plenty.
"""

from __future__ import annotations

import torch

from rlplace.reasoning.batch import SequenceBatch
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.models.tiny_lm import load_tokenizer
from rlplace.reasoning.rewards import Reward, reward_function
from rlplace.reasoning.streams import consumer_key, micro_batches_of
from rlplace.scheduler import Channel, Worker


class RewardWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, inference_world_size: int) -> None:
        self.cfg = cfg
        self.inference_world_size = inference_world_size
        self.tokenizer = load_tokenizer(model_path)
        self.reward = reward_function(cfg.task.reward)  # not the task's problems: scoring needs none of them

    def compute_rewards(self, num_micro_batches: int, inbox: Channel, out: Channel) -> int:
        """Score this rank's micro-batches of the step as they arrive on `inbox` and pass them on through `out`;
        returns how many."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        for _ in mine:
            batch: SequenceBatch = inbox.get(key=f"reward{self.rank}")
            with self.span("reward"):
                batch.rewards = score(self.reward, self.tokenizer, batch)
            out.put(batch, key=consumer_key("inference", batch.index, self.inference_world_size))
        return len(mine)


def score(reward: Reward, tokenizer, batch: SequenceBatch) -> torch.Tensor:
    """[B] float rewards: `reward` of each decoded response."""
    texts = tokenizer.batch_decode(batch.responses, skip_special_tokens=True)
    return torch.tensor([reward(text, answer) for text, answer in zip(texts, batch.answers, strict=True)])
