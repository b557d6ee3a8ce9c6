"""Interactions (`rollout.multi_turn.interaction`): how one is named and checked, what it may return, the registered
`retry`, the feedback turn a chat template writes, and how its scores join the training reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplace.core.errors import ConfigError
from rlplace.reasoning.config import MultiTurnConfig, RewardConfig
from rlplace.reasoning.interactions import RETRY_TEXT, Reply, feedback_template, interaction_function, reply_of
from rlplace.reasoning.models.char_tokenizer import build_char_tokenizer
from rlplace.reasoning.models.tiny_qwen2 import train_tokenizer
from rlplace.reasoning.rewards import reward_function, with_interaction


def hinted(prompt: str, turns, answer: str, extra) -> tuple[bool, str, float]:
    return turns[-1] == answer, f"the answer has {len(answer)} digits", 0.0


def test_an_interaction_is_a_registered_name_a_module_function_or_a_file_function(tmp_path: Path) -> None:
    exact = reward_function("exact_match")
    assert interaction_function(f"{__name__}:hinted", exact)("1+1=", ["3"], "2", {}) == (
        False,
        "the answer has 1 digits",
        0.0,
    )
    file = tmp_path / "games.py"
    file.write_text("def guess(prompt, turns, answer, extra):\n    return len(turns) > 2, 'higher', -1.0\n")
    assert interaction_function(f"{file}:guess", exact)("", ["1", "2", "3"], "", {}) == (True, "higher", -1.0)
    assert MultiTurnConfig(interaction="retry").enabled and not MultiTurnConfig().enabled


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"interaction": "retries"}, r"rollout.multi_turn.interaction = 'retries' is invalid: valid: retry, "),
        ({"interaction": "missing.py:guess"}, r"rollout.multi_turn.interaction = '.*missing.py:guess' cannot be load"),
        ({"feedback_template": "no text"}, r"rollout.multi_turn.feedback_template = 'no text' is invalid: a text "),
        ({"max_user_turns": 0}, r"rollout.multi_turn.max_user_turns = 0 is invalid: at least 1"),
    ],
)
def test_interaction_settings_are_checked(settings: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        MultiTurnConfig(**{"interaction": "retry", **settings})


def test_the_interactions_weight_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"reward.interaction_weight = -1.0 is invalid: 0 or more"):
        RewardConfig(interaction_weight=-1.0)


def test_retry_judges_each_turn_alone_with_the_runs_reward() -> None:
    """A turn the run's reward scores 1 ends the episode; any other is told to try again; its replies score 0."""
    retry = interaction_function("retry", reward_function("gsm8k"))
    assert retry("Q", ["So #### 41"], "42", {}) == Reply(False, RETRY_TEXT, 0.0)
    assert retry("Q", ["So #### 41", "No: #### 42"], "42", {}) == Reply(True, "", 0.0)


def test_what_an_interaction_returns_is_checked() -> None:
    assert reply_of("mine", (True, "", 1)) == Reply(True, "", 1.0)
    for wrong in [(1, "", 0.0), (False, 3, 0.0), (False, "", "1"), (False, ""), "text", None]:
        with pytest.raises(TypeError, match=r"rollout.multi_turn.interaction = 'mine' returned .*: an interaction "):
            reply_of("mine", wrong)


def test_the_feedback_turn_is_the_chat_templates_user_turn_after_the_models_end_token() -> None:
    """ChatML: the model's turn ends with <|im_end|> (its EOS); the feedback goes in a user turn, and the assistant's
    header follows. Plain prompts get the text alone; a template of the run's is taken as it is."""
    chat = train_tokenizer(["What is 2 + 2?", "4"], 300)
    assert (
        feedback_template(chat, None, chat=True) == "\n<|im_start|>user\n{feedback}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert feedback_template(chat, None, chat=False) == "{feedback}"
    assert feedback_template(build_char_tokenizer(), "\n{feedback}\n", chat=False) == "\n{feedback}\n"


def test_the_interactions_scores_join_the_training_reward_at_their_weight() -> None:
    assert with_interaction({"score": 1.0, "format": 0.1}, 2.0, 0.5) == {
        "score": 2.0,
        "format": 0.1,
        "interaction": 2.0,
    }
    assert with_interaction({"score": 1.0}, 2.0, 0.0) == {"score": 1.0, "interaction": 2.0}
