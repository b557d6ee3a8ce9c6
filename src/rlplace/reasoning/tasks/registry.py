"""The reasoning task registry and the schema every task's config section extends (schema per option).

A task is a config dataclass extending `ReasoningTaskConfig` with the fields of that task alone, whose
`prompt_source` builds its `PromptSource`; `TASKS` maps `task.name` to that dataclass. Its option file starts from
the dataclass (`defaults: [/schema/task/<name>@_here_]`, registered with Hydra by `rlplace.families.register`), so a
key another task has is refused while composing, and `task.name` is checked against the registry. Pure Python: the
CLIs check configs with it before Ray or torch load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rlplace.core.errors import ConfigError, check
from rlplace.core.registry import Registry

if TYPE_CHECKING:
    from .prompts import PromptSource


@dataclass
class ReasoningTaskConfig:
    """What every reasoning task has: prompts with a reference answer; a held-out split measures accuracy. Each task's
    own fields live in its subclass (`ArithmeticTaskConfig`, `DatasetTaskConfig`). Responses are scored by the `reward`
    section, which falls back on the task's `default_reward`."""

    default_reward: ClassVar[str] = "exact_match"
    """The reward a run of this task uses when `reward.function` is not set (a registered name)."""

    name: str = "arithmetic"
    """A registered task (`TASKS`): `arithmetic` (generated problems) or `dataset` (your own files); its option file
    starts from that task's schema."""
    prompts_per_step: int = 32
    """Prompts per training step; each is answered algorithm.group_size times."""
    eval_size: int = 200
    """Problems in the held-out evaluation split."""
    data_seed: int = 0
    """Seed of the problem streams, fixed apart from runner.seed so that every run (and the cached pretrained
    model) sees the same held-out split."""
    system_prompt: str | None = None
    """A system turn before each prompt (with a chat template; without one, a line before the prompt)."""
    prompt_template: str | None = None
    """The user's turn as the model is asked it, `{prompt}` standing for the record's prompt (OpenRLHF's
    `input_template`; the R1-Zero style of asking a base model: "User: {prompt}\nAssistant: <think>"). None: the
    prompt as it is. Rewards still get the record's prompt."""
    apply_chat_template: bool | None = None
    """Render prompts with the tokenizer's chat template and its generation prompt; None: when the tokenizer has one
    (the tiny LM's character tokenizer has none)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Variables for the chat template besides the conversation (verl's `data.apply_chat_template_kwargs`), such as
    Qwen3's `enable_thinking: false`. A name the model's template never reads is refused before any worker starts."""

    def __post_init__(self) -> None:
        schema = TASKS[self.name]
        if not isinstance(self, schema):
            raise ConfigError(
                f"task.name = {self.name!r} is invalid for a task section typed {type(self).__name__}: the {self.name} "
                f"task's fields are those of {schema.__name__} (its option file starts from "
                f"/schema/task/{self.name}@_here_)"
            )
        check(self.prompts_per_step >= 1, "task.prompts_per_step", self.prompts_per_step, "at least 1")
        check(self.eval_size >= 1, "task.eval_size", self.eval_size, "at least 1")
        check(self.data_seed >= 0, "task.data_seed", self.data_seed, "0 or more")
        check(
            self.prompt_template is None or PROMPT in self.prompt_template,
            "task.prompt_template",
            self.prompt_template,
            f"null, or a text holding {PROMPT} where the record's prompt goes",
        )

    def origin(self, split: str) -> tuple[str, object]:
        """The config key, and its value, that the problems of `split` ("train" or "eval") come from, for an error
        about them: the task itself, for a task that makes its problems."""
        return "task.name", self.name

    def prompt_source(self) -> PromptSource:
        """The task's problems; its streams are seeded by `data_seed`."""
        raise NotImplementedError(f"{type(self).__name__} builds no prompt source: register a task's own schema")


PROMPT = "{prompt}"
"""Where `task.prompt_template` puts the record's prompt."""

TASKS: Registry[type[ReasoningTaskConfig]] = Registry("task.name")
"""`task.name` -> the task's config dataclass (its schema, whose `prompt_source` builds the task)."""
