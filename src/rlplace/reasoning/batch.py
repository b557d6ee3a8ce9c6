"""`SequenceBatch`: the unit that flows rollout -> reward -> inference -> actor in reasoning tasks.

One batch is one micro-batch of prompts, each answered `group_size` times, rows of one prompt adjacent. Prompts are
left-padded to a common width and responses right-padded to `rollout.max_new_tokens`, so that `prompt + response`
rows line up: the response always starts at column `prompt_width`, and every micro-batch of a step has the same
response width, whichever worker made it. Fields fill in as the batch moves down the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .losses import logprobs_from_logits
from .micro_batches import MicroBatch, plan_micro_batches
from .streams import SCORING_ROWS

if TYPE_CHECKING:
    from .tasks.prompts import Problem


@dataclass
class SequenceBatch:
    index: int
    """Micro-batch number within the step; the actor orders what it receives by it, so arrival order never
    matters."""
    prompts: Tensor
    """[B, P] prompt token ids, left-padded with the pad id."""
    prompt_mask: Tensor
    """[B, P] 1 on real prompt tokens."""
    responses: Tensor
    """[B, T] response token ids, right-padded with the pad id; T = rollout.max_new_tokens."""
    response_mask: Tensor
    """[B, T] 1 on generated tokens (the EOS that ended a response included)."""
    problems: list[Problem]
    """The problem of each row (repeated across a prompt's group): prompt text, reference answer and other fields,
    what the reward function receives."""
    rewards: Tensor | None = None
    """[B] training rewards (filled by the reward worker; the "score" of `rlplace.reasoning.rewards`)."""
    old_logprobs: Tensor | None = None
    """[B, T] log-probs of the responses under the weights that generated them (inference worker); the actor
    replaces them by its own before an asynchronous update (`LLMActorWorker.compute_advantages`)."""
    ref_logprobs: Tensor | None = None
    """[B, T] log-probs under the reference (initial) model, when algorithm.kl_coef > 0 (inference worker)."""
    meta: dict[str, float] = field(default_factory=dict)
    """Per-micro-batch measurements on its way (generation seconds, `reward/<name>` sums over the rows), summed by the
    runner."""
    version: int = 0
    """The weight version that generated it (older than the actor's with runner.max_staleness > 0)."""
    tool_mask: Tensor | None = None
    """[B, T] 1 on response tokens a tool or the interaction wrote (`rollout.multi_turn`); None: the model wrote every
    one."""
    rollout_logprobs: Tensor | None = None
    """[B, T] the rollout engine's log-probs of the tokens it drew (`algorithm.behaviour_logprobs: rollout`; 0 where
    a tool or the interaction wrote); None: not asked for."""
    interaction_scores: Tensor | None = None
    """[B] the interaction's scores of each response's turns, summed (`rollout.multi_turn.interaction`); the reward
    worker adds them to the training reward."""

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def action_mask(self) -> Tensor:
        """[B, T] 1 on the tokens the model generated: what the policy is trained on and the advantages are over
        (the response mask less the tools' and the interaction's tokens)."""
        return self.response_mask if self.tool_mask is None else self.response_mask * (1 - self.tool_mask)

    @property
    def num_rows(self) -> int:
        return int(self.prompts.shape[0])

    def prompt_ids(self) -> list[list[int]]:
        """Each row's prompt tokens without the padding before them."""
        return [row[mask.bool()].tolist() for row, mask in zip(self.prompts, self.prompt_mask, strict=True)]

    def response_ids(self) -> list[list[int]]:
        """Each row's generated tokens without the padding after them, to decode: the pad id 0 is a real token of
        many vocabularies (Qwen's and Llama 3's "!"), which `skip_special_tokens` would keep."""
        return [row[mask.bool()].tolist() for row, mask in zip(self.responses, self.response_mask, strict=True)]

    @staticmethod
    def concat(parts: list[SequenceBatch]) -> SequenceBatch:
        """One batch of every part's rows, in micro-batch order; prompts re-padded on the left to a common width."""
        parts = sorted(parts, key=lambda p: p.index)
        width = max(p.prompts.shape[1] for p in parts)

        def left_pad(t: Tensor, value: int) -> Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        merged: dict[str, object] = {
            "index": parts[0].index,
            "version": parts[0].version,  # one step's micro-batches, all from one version
            "prompts": torch.cat([left_pad(p.prompts, 0) for p in parts]),
            "prompt_mask": torch.cat([left_pad(p.prompt_mask, 0) for p in parts]),
            "problems": [problem for p in parts for problem in p.problems],
            "meta": {k: sum(p.meta.get(k, 0.0) for p in parts) for k in parts[0].meta},
        }
        for f in fields(SequenceBatch):
            if f.name not in merged:
                values = [getattr(p, f.name) for p in parts]
                merged[f.name] = None if values[0] is None else torch.cat(values)
        return SequenceBatch(**merged)  # type: ignore[arg-type]


def scoring_passes(batch: SequenceBatch, max_tokens: int | None = None) -> list[MicroBatch]:
    """The forward passes that score `batch` (`response_logprobs`): with `max_tokens` (inference.
    max_tokens_per_micro_batch), rows shortest first in passes of about that many tokens, each trimmed to the columns
    its rows use; without, SCORING_ROWS rows a pass, in order, untrimmed."""
    if max_tokens is not None:
        rows = torch.arange(batch.num_rows)
        return plan_micro_batches(rows, batch.prompt_mask, batch.response_mask, max_tokens)
    return [MicroBatch(rows) for rows in torch.arange(batch.num_rows).split(SCORING_ROWS)]


@torch.no_grad()
def response_logprobs(
    model: torch.nn.Module,
    batch: SequenceBatch,
    temperature: float = 1.0,
    passes: list[MicroBatch] | None = None,
) -> Tensor:
    """[B, T] log-probs (on the CPU) of each response token under `model` at `temperature`, one forward pass per entry
    of `passes` (`scoring_passes`; None: its default), in eval mode (no dropout) whatever mode the model is in: the
    inference worker's copy and the actor's own weights score alike. Columns a trimmed pass leaves out are 0."""
    out = torch.zeros(batch.responses.shape)
    training = model.training
    model.eval()
    try:
        for micro_batch in scoring_passes(batch) if passes is None else passes:
            input_ids, attention_mask, width = trimmed_inputs(batch, micro_batch)
            logits = response_logits(model, input_ids, attention_mask, width, temperature)
            scored = logprobs_from_logits(logits, input_ids[:, width:].to(logits.device)).cpu()
            out[micro_batch.rows, : scored.shape[1]] = scored
    finally:
        model.train(training)
    return out


def trimmed_inputs(batch: SequenceBatch, micro_batch: MicroBatch) -> tuple[Tensor, Tensor, int]:
    """A pass's prompt + response token ids and attention mask, its columns trimmed, and its prompt width."""
    width = batch.prompts.shape[1]
    end = None if micro_batch.length is None else width + micro_batch.length
    columns = slice(micro_batch.left, end)
    rows = micro_batch.rows
    return batch.input_ids[rows, columns], batch.attention_mask[rows, columns], width - micro_batch.left


def response_logits(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, prompt_width: int, temperature: float = 1.0
) -> Tensor:
    """[B, T, V] logits predicting the tokens after `prompt_width` (the responses), on the model's device, divided by
    `temperature`: the policy the rollout sampled from at that temperature (`rollout.temperature`), whose log-probs,
    ratios, KL and entropy the update takes, as verl's and OpenRLHF's actors do.

    Positions count real tokens only (left padding does not shift them), as generation counted them, so training
    scores each token at the position the rollout generated it.
    """
    device = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, prompt_width - 1 : -1]
    return logits if temperature == 1.0 else logits.div_(temperature)  # in place: no second [B, T, V] tensor
