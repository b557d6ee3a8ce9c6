"""Responses in turns: generation that pauses at a tool call, appends the tool's response, and goes on after it.

A response is the model's turns and the tools' responses between them, within rollout.max_new_tokens in all. Each
turn is one `GenerationEngine.generate` call over the rows still going, stopping at `rollout.multi_turn.call_end`; the
tool's response is encoded and appended, marked in the row's tool mask (the actor does not train on it). Turn t of
sample s samples with the id `turn_sample_id(s, t)`, so a row's whole response stays a function of (seed, sample
id), whichever batch, micro-batch or rank makes it, and turn 0 samples as a one-turn response does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlplace.core.errors import ConfigError
from rlplace.reasoning.tools import RESULT, tool_function

if TYPE_CHECKING:
    from rlplace.reasoning.config import MultiTurnConfig
    from rlplace.reasoning.tasks.prompts import Problem

    from .engine import GenerationEngine

TURN_SHIFT = 56
"""Turn t samples with the sample id plus t << TURN_SHIFT: above every sample id a run makes (below 2^40 per
generation round, `workers.rollout`), within int64."""


def turn_sample_id(sample_id: int, turn: int) -> int:
    return sample_id + (turn << TURN_SHIFT)


def call_end_id(tokenizer: Any, settings: MultiTurnConfig) -> int:
    """The token id of rollout.multi_turn.call_end; ConfigError in one line when the tokenizer reads it as other than
    one token (a stop must be a token the engines can stop at)."""
    ids = tokenizer.encode(settings.call_end, add_special_tokens=False)
    if len(ids) != 1:
        raise ConfigError(
            f"rollout.multi_turn.call_end = {settings.call_end!r} is invalid: the model's tokenizer reads it as "
            f"{len(ids)} tokens {ids}; valid: one token of its vocabulary (a special token of the model, or one "
            "added to its tokenizer)"
        )
    return ids[0]


@dataclass
class Turns:
    """A batch's responses made in turns."""

    responses: list[list[int]]
    """Each row's tokens: the model's and the tools', in order."""
    tool_masks: list[list[int]]
    """1 where a tool wrote the token, 0 where the model did; as long as the response."""
    calls: list[int]
    """Tool calls per row."""


class ToolCalling:
    """Generates responses in turns with the tool of `settings` (`rollout.multi_turn`)."""

    def __init__(self, tokenizer: Any, settings: MultiTurnConfig) -> None:
        assert settings.tool is not None, "multi-turn generation needs rollout.multi_turn.tool"
        self.tokenizer = tokenizer
        self.settings = settings
        self.tool = tool_function(settings.tool)
        self.end_id = call_end_id(tokenizer, settings)

    def generate(
        self,
        engine: GenerationEngine,
        prompts: list[list[int]],
        sample_ids: list[int],
        problems: list[Problem],
        *,
        max_new_tokens: int,
        **sampling: Any,
    ) -> Turns:
        """Each prompt's response, `sampling` passed on to `engine.generate` (temperature, seed, top_p, top_k)."""
        rows = len(prompts)
        turns = Turns([[] for _ in range(rows)], [[] for _ in range(rows)], [0] * rows)
        going = list(range(rows))
        turn = 0
        while going:
            segments = engine.generate(
                [prompts[i] + turns.responses[i] for i in going],
                [turn_sample_id(sample_ids[i], turn) for i in going],
                max_new_tokens=[max_new_tokens - len(turns.responses[i]) for i in going],
                stop_ids=[self.end_id],
                **sampling,
            )
            going = [
                i
                for i, segment in zip(going, segments, strict=True)
                if self._go_on(turns, i, segment, problems[i], max_new_tokens)
            ]
            turn += 1
        return turns

    def _go_on(self, turns: Turns, row: int, segment: list[int], problem: Problem, max_new_tokens: int) -> bool:
        """Append the model's `segment` to `row`; where it ends in a call the row may still make, append the tool's
        response too (cut to max_response_tokens and to the room left) and return whether the row has room for
        another turn."""
        response, mask = turns.responses[row], turns.tool_masks[row]
        response += segment
        mask += [0] * len(segment)
        room = max_new_tokens - len(response)
        if not segment or segment[-1] != self.end_id or turns.calls[row] >= self.settings.max_tool_calls or room <= 0:
            return False
        text = self.tokenizer.decode(segment[:-1])
        call = text.rpartition(self.settings.call_start)[2]
        answer = self.tool(call, problem.extra)
        reply = self.settings.response_template.replace(RESULT, str(answer))
        ids = self.tokenizer.encode(reply, add_special_tokens=False)[: min(self.settings.max_response_tokens, room)]
        response += ids
        mask += [1] * len(ids)
        turns.calls[row] += 1
        return len(response) < max_new_tokens
