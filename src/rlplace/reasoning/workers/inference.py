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
forward pass, so that a model too large for one device is scored as it is trained, at the actor's precision. Sharded
forward passes are collective: a rank with fewer micro-batches than another runs passes on one token to keep in step.
"""

from __future__ import annotations

import torch

from rlplace.core.offload import HostCopies, move
from rlplace.core.strategies.base import build_strategy
from rlplace.core.weights import receive_weights
from rlplace.reasoning import lora
from rlplace.reasoning.batch import SequenceBatch, response_logprobs
from rlplace.reasoning.config import LoRAConfig, ReasoningConfig
from rlplace.reasoning.models.tiny_lm import load_causal_lm
from rlplace.reasoning.streams import SCORING_ROWS, consumer_key, micro_batches_of
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
        actor through `out`; returns how many."""
        mine = micro_batches_of(self.rank, self.world_size, num_micro_batches)
        for _ in mine:
            batch: SequenceBatch = inbox.get(key=f"inference{self.rank}")
            temperature = self.cfg.rollout.scoring_temperature
            with self.span("inference"):
                batch.old_logprobs = response_logprobs(self.policy, batch, temperature)
                if self.shared_reference:
                    with lora.without_adapters(self.policy):
                        batch.ref_logprobs = response_logprobs(self.policy, batch, temperature)
                elif self.reference is not None:
                    batch.ref_logprobs = response_logprobs(self.reference, batch, temperature)
            out.put(batch, key=consumer_key("actor", batch.index, self.actor_world_size))
        if self.strategy.collective_passes:  # the passes of the micro-batches rank 0 has more of
            missing = len(micro_batches_of(0, self.world_size, num_micro_batches)) - len(mine)
            rows = self.cfg.rollout.micro_batch_prompts * self.cfg.algorithm.group_size
            scored = [*self._models(), *([self.policy] if self.shared_reference else [])]
            keep_in_step(scored, missing, rows, self.device)
        return len(mine)

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


@torch.no_grad()
def keep_in_step(models: list[torch.nn.Module], micro_batches: int, rows: int, device: torch.device) -> None:
    """The forward passes of sharded `models` for `micro_batches` micro-batches of `rows` rows that this rank does not
    have, each on one token, in the order `InferenceWorker.compute_logprobs` runs them on the ranks that have them
    (each model's passes for one micro-batch, `response_logprobs`' count, then the next model's): every pass
    gathers its model's units from every rank. Every micro-batch of a step has the same rows
    (`rollout.micro_batch_prompts` x `algorithm.group_size`)."""
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    for _ in range(micro_batches):
        for model in models:
            for _ in range(-(-rows // SCORING_ROWS)):
                model(input_ids=token)
