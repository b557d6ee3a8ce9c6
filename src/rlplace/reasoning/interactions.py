"""Interactions: what answers a reasoning policy each time it ends a turn (`rollout.multi_turn.interaction`).

Where a tool answers a call in the middle of a turn (`tools`), an interaction is the other side of a conversation, as
verl's interactions and OpenRLHF's agent environments are: when the model ends its turn (an end token), the
interaction reads the turns so far and replies with `(done, text, score)`, verl's order. `done` ends the episode;
otherwise `text` is the next user turn the model reads (through `rollout.multi_turn.feedback_template`) and the
model goes on. Each reply's `score` is summed over the episode into the response's training reward
(`reward.interaction_weight`). An interaction is a function of the episode so far, never of state kept between calls,
so a response stays the same whichever batch, rank or placement makes it (`generation.turns`).

An interaction is a registered name, made for the run from its reward function (`retry`), `package.module:function`
or `path/to/file.py:function`, a function `(prompt, turns, answer, extra) -> (done, text, score)`. Pure Python: the
name is checked on the driver before anything starts; a rollout rank loads the function where it generates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from typing import Any, NamedTuple

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry, load_function
from rlplace.reasoning.rewards import SCORE, RewardFunction

KEY = "rollout.multi_turn.interaction"
FEEDBACK = "{feedback}"
"""Where rollout.multi_turn.feedback_template puts the interaction's text."""


class Reply(NamedTuple):
    """What an interaction answers a turn with, in the order of verl's `generate_response` (without its metadata)."""

    done: bool
    """The episode ends here: the model writes no further turn."""
    text: str = ""
    """The next user turn, which the model reads (unused when done)."""
    score: float = 0.0
    """This turn's score, added to the episode's reward."""


Interaction = Callable[[str, Sequence[str], str, Mapping[str, Any]], Reply | tuple]
"""`(prompt, turns, answer, extra) -> (done, text, score)`: `turns` the text of each of the model's turns so far (the
last the one just ended), `answer` and `extra` the problem's."""

INTERACTIONS: Registry[Callable[[RewardFunction], Interaction]] = Registry(KEY)
"""Registered interactions, each made for a run from its reward function."""

RETRY_TEXT = "Incorrect. Try again."
"""What `retry` tells a model whose turn was wrong."""


@INTERACTIONS.register("retry")
def retry(reward: RewardFunction) -> Interaction:
    """verl's GSM8K interaction for any task: each turn is scored alone with the run's `reward.function`; a turn that
    scores 1 or more (correct, for the registered rewards) ends the episode, any other is told it is wrong and tried
    again, until `max_user_turns` retries are spent. Its replies score 0: the run's reward function scores the whole
    response as it does without an interaction (the last answer, for the `gsm8k` and `boxed` rewards)."""

    def interact(prompt: str, turns: Sequence[str], answer: str, extra: Mapping[str, Any]) -> Reply:
        correct = reward(prompt, turns[-1], answer, extra)[SCORE] >= 1.0
        return Reply(done=correct, text="" if correct else RETRY_TEXT)

    return interact


def reply_of(spec: str, value: Any) -> Reply:
    """`value`, what the interaction `spec` returned, as a Reply; TypeError naming the key and the value when it is not
    `(done, text, score)` (a bool, a string and a number)."""
    if isinstance(value, tuple) and len(value) == 3:
        done, text, score = value
        if isinstance(done, bool) and isinstance(text, str) and isinstance(score, Real):
            return Reply(done, text, float(score))
    what = "an interaction returns (done: bool, text: str, score: float)"
    raise TypeError(f"{KEY} = {spec!r} returned {value!r}: {what}")


def check_interaction(spec: str) -> None:
    """ConfigError in one line naming the key, the value and what is valid when `spec` names no interaction."""
    _load(spec)


def interaction_function(spec: str, reward: RewardFunction) -> Interaction:
    """The interaction `spec` names: a registered one, made from the run's `reward`, `package.module:function` or
    `path/to/file.py:function`."""
    found = _load(spec)
    return found if ":" in spec else found(reward)


def _load(spec: str) -> Callable[..., Any]:
    valid = f"valid: {', '.join(INTERACTIONS.names())}, package.module:function or path/to/file.py:function"
    what = "an interaction is a function (prompt, turns, answer, extra) -> (done, text, score)"
    return load_function(INTERACTIONS, spec, valid, what)


def feedback_template(tokenizer: Any, template: str | None, chat: bool) -> str:
    """The text that goes after a turn the model ended, `{feedback}` replaced by the interaction's text:
    rollout.multi_turn.feedback_template when set; else, for prompts rendered with the tokenizer's chat template
    (`chat`), what that template writes between the end of an assistant turn and the next one (a user turn holding the
    text, then the assistant's header), less the end token the model wrote; else the text alone. ConfigError in one
    line when the chat template does not render an assistant turn's content as it is."""
    if template is not None:
        return template
    if not chat:
        return FEEDBACK
    content = "\x00turn\x00"
    messages = [{"role": "user", "content": "question"}, {"role": "assistant", "content": content}]
    rendered = tokenizer.apply_chat_template(
        [*messages, {"role": "user", "content": FEEDBACK}], tokenize=False, add_generation_prompt=True
    )
    if rendered.count(content) != 1 or FEEDBACK not in rendered:
        raise ConfigError(
            f"rollout.multi_turn.feedback_template = null is invalid: the model's chat template does not write an "
            f"assistant turn and a user turn as they are; valid: a text holding {FEEDBACK} (what follows the model's "
            "end token)"
        )
    after = rendered.split(content, 1)[1]
    end = tokenizer.eos_token or ""
    return after[len(end) :] if end and after.startswith(end) else after
