"""InferenceWorker: log-probs of the generated responses under the current policy and the reference model.

The old log-probs are recomputed here with the training model's own forward pass rather than taken from the
engine (vLLM's kernels differ from training's in the last bits), so the PPO ratio starts at exactly 1 for the
current weights. The reference model is the starting checkpoint, frozen; it is loaded only when
`algorithm.kl_coef > 0`. The policy copy receives the actor's weights each step, as the rollout does, so its
log-probs are always those of the weights that generated the responses: with runner.max_staleness > 0 they are the
behaviour policy's, which the actor weighs its update by.
"""

from __future__ import annotations

import torch

from rlplace.core.offload import HostCopies, move
from rlplace.core.weights import receive_weights
from rlplace.reasoning.batch import SequenceBatch, response_logprobs
from rlplace.reasoning.config import ReasoningConfig
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.streams import consumer_key, micro_batches_of
from rlplace.scheduler import Channel, Worker, timer


class InferenceWorker(Worker):
    def __init__(self, cfg: ReasoningConfig, model_path: str, actor_world_size: int) -> None:
        self.cfg = cfg
        self.actor_world_size = actor_world_size
        self.policy = load_causal_lm(model_path, self.device).requires_grad_(False)
        self.reference = (
            load_causal_lm(model_path, self.device).requires_grad_(False) if cfg.algorithm.kl_coef else None
        )
        self.host_copies = HostCopies()
        self.version = 0

    @timer("sync_weights")
    def sync_weights(self) -> int:
        self.version = receive_weights(self, self.policy, src_group="actor")
        return self.version

    def compute_logprobs(self, num_micro_batches: int, inbox: Channel, out: Channel) -> int:
        """Old (and reference) log-probs for this rank's micro-batches as they arrive on `inbox`, passed on to the
        actor through `out`; returns how many."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        for _ in mine:
            batch: SequenceBatch = inbox.get(key=f"inference{self.rank}")
            with self.span("inference"):
                batch.old_logprobs = response_logprobs(self.policy, batch)
                if self.reference is not None:
                    batch.ref_logprobs = response_logprobs(self.reference, batch)
            out.put(batch, key=consumer_key("actor", batch.index, self.actor_world_size))
        return len(mine)

    @timer("offload")
    def offload(self) -> int:
        return sum(move(m, None, torch.device("cpu"), self.host_copies).bytes for m in self._models())

    @timer("onload")
    def onload(self) -> int:
        return sum(move(m, None, self.device, self.host_copies).bytes for m in self._models())

    def _models(self) -> list[torch.nn.Module]:
        return [m for m in (self.policy, self.reference) if m is not None]
