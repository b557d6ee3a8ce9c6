"""Token-budget micro-batches (`actor.max_tokens_per_micro_batch`): an optimizer step's rows cut by what they cost.

A fixed number of rows per forward pass makes a pass of long responses cost many times one of short ones, and the
budget must then be set for the longest. Cutting by tokens instead (verl's dynamic batch size, OpenRLHF's packing)
keeps every pass near the budget: rows are taken shortest first, a pass is as wide as its longest row (the columns
that are padding in all of its rows are dropped), and a pass holds as many rows as fit rows x width <= budget (one row
at least). The gradients of the passes accumulate into the step's; the losses are each pass's part of the
minibatch's means (`losses.Counts`), so the step trains the same update however the rows are cut, but for float
summation order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class MicroBatch:
    """One forward and backward pass: `rows` of the batch, with columns trimmed to what they use."""

    rows: Tensor
    """Local row indices."""
    left: int = 0
    """Prompt columns dropped on the left (left padding in every row)."""
    length: int | None = None
    """Response columns kept (None: all)."""
    weight: float = 1.0
    """0 for a pass that only keeps a rank in step with the others (`Strategy.collective_passes`)."""


def plan_micro_batches(
    rows: Tensor, prompt_mask: Tensor, response_mask: Tensor, max_tokens: int | None
) -> list[MicroBatch]:
    """`rows` (local indices) as passes of at most `max_tokens` padded tokens each; None: one pass of every row,
    untrimmed. No rows: no pass."""
    if rows.numel() == 0:
        return []
    if max_tokens is None:
        return [MicroBatch(rows)]
    prompt_lengths = prompt_mask[rows].sum(-1)
    response_lengths = response_mask[rows].sum(-1)
    order = torch.argsort(prompt_lengths + response_lengths, stable=True)
    passes: list[MicroBatch] = []
    taken: list[int] = []
    prompt_width = response_width = 0
    for position in order.tolist():
        wider_prompt = max(prompt_width, int(prompt_lengths[position]))
        wider_response = max(response_width, int(response_lengths[position]))
        if taken and (len(taken) + 1) * (wider_prompt + wider_response) > max_tokens:
            passes.append(_trimmed(rows[taken], prompt_mask.shape[1], prompt_width, response_width))
            taken, wider_prompt, wider_response = [], int(prompt_lengths[position]), int(response_lengths[position])
        taken.append(position)
        prompt_width, response_width = wider_prompt, wider_response
    passes.append(_trimmed(rows[taken], prompt_mask.shape[1], prompt_width, response_width))
    return passes


def _trimmed(rows: Tensor, full_prompt_width: int, prompt_width: int, response_width: int) -> MicroBatch:
    # A response of no valid token still needs one column: its log-prob and loss terms are masked, never empty.
    return MicroBatch(rows, left=full_prompt_width - max(prompt_width, 1), length=max(response_width, 1))


PADDING_PASS = MicroBatch(torch.zeros(1, dtype=torch.long), weight=0.0)
"""A zero-weighted pass on a rank's first row: it gathers and reduces like a real one and changes nothing."""
