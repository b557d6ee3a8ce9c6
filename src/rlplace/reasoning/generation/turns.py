"""Responses in turns: generation that pauses at a tool call or at the end of the model's turn, appends the tool's
answer or the interaction's reply, and goes on after it.

A response is the model's turns and what tools and the interaction wrote between them, within
rollout.max_new_tokens in all. Each turn is one `GenerationEngine.generate` call over the rows still going, stopping
at `rollout.multi_turn.call_end` (with a tool) or at an end token; what is appended is encoded and marked in the row's
tool mask (the actor does not train on it). Turn t of sample s samples with the id `turn_sample_id(s, t)`, so a row's
whole response stays a function of (seed, sample id), whichever batch, micro-batch or rank makes it, and turn 0
samples as a one-turn response does; an interaction is a function of the episode so far, so its replies are too.

A row's tool call or interaction reply starts as soon as the engine reports that the row's turn has ended, while the
turn's other rows decode (`GenerationEngine.generate`'s `on_done`); the calls run concurrently (`calls.Calls`,
rollout.multi_turn.max_concurrent_calls), each within rollout.multi_turn.call_timeout_s: a tool's failed call is
answered `error: ...`, which the model reads; an interaction's ends the episode. Both are counted per row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from rlplace.core.errors import ConfigError
from rlplace.reasoning.interactions import FEEDBACK, feedback_template, interaction_function, reply_of
from rlplace.reasoning.tools import RESULT, ToolSet

from .calls import Calls, Outcome

if TYPE_CHECKING:
    from rlplace.reasoning.config import MultiTurnConfig
    from rlplace.reasoning.rewards import RewardFunction
    from rlplace.reasoning.tasks.prompts import Problem

    from .engine import GenerationEngine

log = logging.getLogger(__name__)

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
    """Each row's tokens: the model's, the tools' and the interaction's, in order."""
    tool_masks: list[list[int]]
    """1 where a tool or the interaction wrote the token, 0 where the model did; as long as the response."""
    calls: list[int]
    """Tool calls per row."""
    user_turns: list[int] = field(default_factory=list)
    """The interaction's replies each row's model read."""
    scores: list[float] = field(default_factory=list)
    """The interaction's scores of each row's turns, summed."""
    logprobs: list[list[float]] = field(default_factory=list)
    """With `logprobs`, each token's log-prob under the distribution the engine drew it from (0 where a tool or the
    interaction wrote it); as long as the response. Empty lists otherwise."""
    tool_errors: list[int] = field(default_factory=list)
    """Each row's tool calls that raised or missed rollout.multi_turn.call_timeout_s (answered `error: ...`)."""
    interaction_errors: list[int] = field(default_factory=list)
    """Each row's interaction replies that raised or missed the timeout (0 or 1: the episode ended there)."""

    @classmethod
    def empty(cls, rows: int) -> Turns:
        def lists() -> list:
            return [[] for _ in range(rows)]

        return cls(lists(), lists(), [0] * rows, [0] * rows, [0.0] * rows, lists(), [0] * rows, [0] * rows)


class MultiTurn:
    """Generates responses in turns with the tool and the interaction of `settings` (`rollout.multi_turn`); `reward`
    is the run's, which a registered interaction judges turns with; `chat`: prompts are rendered with the tokenizer's
    chat template, whose user turn a feedback goes in (`interactions.feedback_template`)."""

    def __init__(self, tokenizer: Any, settings: MultiTurnConfig, reward: RewardFunction, chat: bool) -> None:
        assert settings.enabled, "multi-turn generation needs rollout.multi_turn.tool or .interaction"
        self.tokenizer = tokenizer
        self.settings = settings
        self.tool = None if settings.tool is None else ToolSet(settings.tool)
        self.end_id = None if settings.tool is None else call_end_id(tokenizer, settings)
        self.interaction = None
        if settings.interaction is not None:
            self.interaction = interaction_function(settings.interaction, reward)
            self.feedback = feedback_template(tokenizer, settings.feedback_template, chat)
        self.warned: set[str] = set()
        """The kinds of call (`tool`, `interaction`) whose first failure has been logged."""

    def generate(
        self,
        engine: GenerationEngine,
        prompts: list[list[int]],
        sample_ids: list[int],
        problems: list[Problem],
        *,
        max_new_tokens: int,
        logprobs: bool = False,
        **sampling: Any,
    ) -> Turns:
        """Each prompt's response (with `logprobs`, its tokens' log-probs too), `sampling` passed on to
        `engine.generate` (temperature, seed, top_p, top_k)."""
        rows = len(prompts)
        turns = Turns.empty(rows)
        texts: list[list[str]] = [[] for _ in range(rows)]
        """The text of each row's model turns so far, what the interaction reads."""
        starts = [0] * rows
        """Where each row's current model turn began in its response."""
        going = list(range(rows))
        turn = 0
        calls = Calls(self.settings.max_concurrent_calls, self.settings.call_timeout_s)
        while going:
            kinds: dict[int, str] = {}
            """The rows whose turn ended in a tool call or at an end token the interaction answers, and the kind of
            the call started for them (`tool` or `interaction`)."""

            def ended(index: int, segment: list[int], going: list[int] = going, kinds: dict[int, str] = kinds) -> None:
                """Start the call a row's turn ended in, as soon as the engine has made the turn (`on_done`); the
                turn is not yet in the row's response."""
                row, call, kind = going[index], None, ""
                problem = problems[row]
                if segment and segment[-1] == self.end_id:
                    call, kind = self._tool_call(turns, row, segment, problem, max_new_tokens), "tool"
                elif segment and self.interaction is not None and segment[-1] in engine.eos_ids:
                    turn_text = self.tokenizer.decode(
                        turns.responses[row][starts[row] :] + segment, skip_special_tokens=True
                    )
                    texts[row].append(turn_text)
                    reply = (problem.prompt, tuple(texts[row]), problem.answer, problem.extra)
                    call, kind = partial(self.interaction, *reply), "interaction"
                if call is not None:
                    calls.start(row, call)
                    kinds[row] = kind

            made = engine.generate(
                [prompts[i] + turns.responses[i] for i in going],
                [turn_sample_id(sample_ids[i], turn) for i in going],
                max_new_tokens=[max_new_tokens - len(turns.responses[i]) for i in going],
                stop_ids=[] if self.end_id is None else [self.end_id],
                logprobs=logprobs,
                on_done=ended,
                **sampling,
            )
            segments, segment_logprobs = made if logprobs else (made, [[] for _ in going])
            for i, segment, segment_logprob in zip(going, segments, segment_logprobs, strict=True):
                turns.responses[i] += segment
                turns.tool_masks[i] += [0] * len(segment)
                turns.logprobs[i] += segment_logprob
            outcomes = calls.outcomes()
            still = []
            for i in going:
                if kinds.get(i) == "tool":
                    going_on = self._answer_call(turns, i, outcomes[i], max_new_tokens)
                elif kinds.get(i) == "interaction":
                    going_on = self._answer_turn(turns, i, outcomes[i], max_new_tokens)
                    starts[i] = len(turns.responses[i])  # the model's next turn
                else:
                    going_on = False
                if going_on:
                    still.append(i)
            going = still
            turn += 1
        if logprobs:  # the model's tokens' log-probs, 0 where a tool or the interaction wrote
            for row, mask in enumerate(turns.tool_masks):
                drawn = iter(turns.logprobs[row])
                turns.logprobs[row] = [0.0 if written else next(drawn) for written in mask]
        return turns

    def _tool_call(
        self, turns: Turns, row: int, segment: list[int], problem: Problem, max_new_tokens: int
    ) -> Callable[[], str] | None:
        """The tool call the model's `segment` (not yet in the row's response) ended in, to run; None where the row
        may make no more calls or has no room left (its response ends)."""
        assert self.tool is not None
        made = len(turns.responses[row]) + len(segment)
        if turns.calls[row] >= self.settings.max_tool_calls or made >= max_new_tokens:
            return None
        call = self.tokenizer.decode(segment[:-1]).rpartition(self.settings.call_start)[2]
        return partial(self.tool, call, problem.extra)

    def _answer_call(self, turns: Turns, row: int, outcome: Outcome, max_new_tokens: int) -> bool:
        """Append the tool's answer (cut to max_response_tokens and to the room left; a call that failed answers
        `error: ...`) and return whether the row has room for another turn."""
        turns.calls[row] += 1
        answer = outcome.value
        if outcome.error is not None:
            turns.tool_errors[row] += 1
            self._warn_once("tool", outcome)
            answer = f"error: {outcome.message}"
        return self._append(turns, row, self.settings.response_template.replace(RESULT, str(answer)), max_new_tokens)

    def _answer_turn(self, turns: Turns, row: int, outcome: Outcome, max_new_tokens: int) -> bool:
        """The interaction's reply to the turn the model ended: its score counts and, unless it ends the episode or
        the row has read max_user_turns replies, its text goes in; returns whether the row goes on. A reply that
        failed ends the episode, scoring 0."""
        if outcome.error is not None:
            turns.interaction_errors[row] += 1
            self._warn_once("interaction", outcome)
            return False
        reply = reply_of(self.settings.interaction, outcome.value)
        turns.scores[row] += reply.score
        last = turns.user_turns[row] >= self.settings.max_user_turns or len(turns.responses[row]) >= max_new_tokens
        if reply.done or last:
            return False
        turns.user_turns[row] += 1
        return self._append(turns, row, self.feedback.replace(FEEDBACK, reply.text), max_new_tokens)

    def _warn_once(self, kind: str, outcome: Outcome) -> None:
        """Log the first failed call of each kind (with its traceback): later ones are only counted."""
        if kind not in self.warned:
            self.warned.add(kind)
            error = outcome.error
            after = "the model reads the error" if kind == "tool" else "its episode ends"
            log.warning(
                "a %s call failed (%s): %s; later failures are only counted (rollout/%s_errors)",
                kind,
                outcome.message,
                after,
                kind,
                exc_info=(type(error), error, error.__traceback__) if error.__traceback__ else None,
            )

    def _append(self, turns: Turns, row: int, text: str, max_new_tokens: int) -> bool:
        """Append `text`'s tokens to `row`, marked as not the model's, cut to max_response_tokens and to the room left;
        returns whether the row has room for another turn."""
        response = turns.responses[row]
        room = max_new_tokens - len(response)
        ids = self.tokenizer.encode(text, add_special_tokens=False)[: min(self.settings.max_response_tokens, room)]
        response += ids
        turns.tool_masks[row] += [1] * len(ids)
        return len(response) < max_new_tokens
