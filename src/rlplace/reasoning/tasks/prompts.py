"""Prompt sources for reasoning RL: the problem record and the source protocol (tasks: arithmetic.py, dataset.py).

A reasoning run does not step a simulator: each step it asks a `PromptSource` for a batch of problems, the rollout
group writes a response per prompt, and the `reward` section's function turns each response into a reward.
Batches are a pure function
of (seed, step), drawn from a stream seeded through SHA-256 rather than Python's per-process salted `hash()`, so any
worker on any node that asks for step `s` gets the same problems, and a resumed run continues where it stopped
without replaying the calls before it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jinja2
import jinja2.meta

from rlplace.core.errors import ConfigError

from .registry import PROMPT

if TYPE_CHECKING:
    from .registry import ReasoningTaskConfig


@dataclass(frozen=True)
class Problem:
    """One prompt and the answer a correct response gives, e.g. `Problem("37+45=", "82")`."""

    prompt: str
    answer: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    """The record's other fields, passed to the reward function."""
    messages: tuple[Mapping[str, str], ...] = ()
    """A chat record's turns (`{"role", "content"}`, the last the user's, whose content is `prompt`); empty for a
    plain prompt, which a chat template renders as one user turn."""


@runtime_checkable
class PromptSource(Protocol):
    """What the reasoning runner consumes: training batches by step and a fixed held-out set."""

    def train_batch(self, step: int, num_prompts: int) -> list[Problem]:
        """`num_prompts` training problems for `step`; the same (seed, step, num_prompts) gives the same problems in
        every process, whatever was asked before. None of them has a prompt of `eval_set()`."""
        ...

    def eval_set(self) -> list[Problem]:
        """The held-out problems, the same on every call."""
        ...


def seeded_rng(*key: int | str) -> random.Random:
    """A random stream determined by `key` alone, identical in every process (SHA-256 of the key, not `hash()`)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def check_batch_request(step: int, num_prompts: int) -> None:
    """Refuse a negative step or batch size before any drawing starts."""
    if step < 0:
        raise ValueError(f"step = {step!r} is invalid: steps count from 0")
    if num_prompts < 0:
        raise ValueError(f"num_prompts = {num_prompts!r} is invalid: at least 0")


def uses_chat_template(tokenizer: Any, task: ReasoningTaskConfig) -> bool:
    """Whether prompts are rendered with the tokenizer's chat template (`task.apply_chat_template`; None: when the
    tokenizer has one). ConfigError when asked for and the tokenizer has none."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if task.apply_chat_template is None:
        return has_template
    if task.apply_chat_template and not has_template:
        raise ConfigError(
            "task.apply_chat_template = true is invalid: the model's tokenizer has no chat template (valid: false, "
            "or null to use one when the tokenizer has it)"
        )
    return task.apply_chat_template


def conversation(problem: Problem, task: ReasoningTaskConfig) -> list[Mapping[str, str]]:
    """The problem's turns (a plain prompt as the user's one), the last (the user's) through task.prompt_template."""
    turns = list(problem.messages) or [{"role": "user", "content": problem.prompt}]
    if task.prompt_template is not None:
        turns[-1] = {**turns[-1], "content": task.prompt_template.replace(PROMPT, turns[-1]["content"])}
    return turns


TRUNCATIONS = ("error", "left", "right", "middle")
"""task.truncation (verl's `data.truncation`): what happens to a prompt longer than task.max_prompt_length."""


def encode_prompts(tokenizer: Any, problems: Sequence[Problem], task: ReasoningTaskConfig) -> list[list[int]]:
    """The token ids of each problem's prompt as the model is asked it: one rendering for generation, evaluation and
    pretraining alike (`render_prompts`), cut to task.max_prompt_length where task.truncation says so
    (`truncate`)."""
    side, limit = getattr(task, "truncation", "error"), getattr(task, "max_prompt_length", None)
    rendered = render_prompts(tokenizer, problems, task)
    return rendered if side == "error" or limit is None else [truncate(ids, limit, side) for ids in rendered]


def truncate(ids: list[int], limit: int, side: str) -> list[int]:
    """`ids` cut to `limit` tokens as verl cuts them: `left` drops the start (the question's end and the generation
    prompt stay), `right` the end, `middle` the middle (the first half of `limit` and the last half kept)."""
    if len(ids) <= limit:
        return ids
    head = {"left": 0, "right": limit, "middle": limit // 2}[side]
    return ids[:head] + ids[len(ids) - (limit - head) :]


def render_prompts(tokenizer: Any, problems: Sequence[Problem], task: ReasoningTaskConfig) -> list[list[int]]:
    """Each problem's prompt as token ids, whole. With a chat template, the conversation (the system prompt, then the
    record's turns or the prompt as the user's, through task.prompt_template) plus the template's generation prompt,
    with task.chat_template_kwargs, and no special tokens beyond the template's; without one, the prompt text after
    the system prompt's line, with the tokenizer's usual special tokens."""
    if not uses_chat_template(tokenizer, task):
        if task.chat_template_kwargs:
            raise ConfigError(
                f"task.chat_template_kwargs = {dict(task.chat_template_kwargs)} is invalid: the prompts are not "
                "rendered with a chat template (task.apply_chat_template, or the tokenizer has none): valid: {}"
            )
        system = "" if task.system_prompt is None else task.system_prompt + "\n"
        texts = [system + "\n".join(m["content"] for m in conversation(p, task)) for p in problems]
        return tokenizer(texts)["input_ids"]
    kwargs = _checked_template_kwargs(tokenizer, task)
    texts = []
    for problem in problems:
        turns = conversation(problem, task)
        if task.system_prompt is not None and turns[0]["role"] != "system":
            turns.insert(0, {"role": "system", "content": task.system_prompt})
        texts.append(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True, **kwargs))
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def _template_variables(template: str) -> set[str]:
    """The variables a chat template reads from its caller (`messages`, `add_generation_prompt`, `enable_thinking`,
    ...), parsed as transformers compiles templates (with loop controls)."""
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    return jinja2.meta.find_undeclared_variables(environment.parse(template))


def _checked_template_kwargs(tokenizer: Any, task: ReasoningTaskConfig) -> dict[str, Any]:
    """task.chat_template_kwargs, each name one the tokenizer's template reads (ConfigError, one line, otherwise: a
    misspelt name would be ignored by the template without a word)."""
    kwargs = dict(task.chat_template_kwargs)
    if not kwargs:
        return kwargs
    template = tokenizer.chat_template
    read = _template_variables(template) if isinstance(template, str) else set(kwargs)
    unknown = sorted(set(kwargs) - read)
    if unknown:
        name = unknown[0]
        raise ConfigError(
            f"task.chat_template_kwargs.{name} = {kwargs[name]!r} is invalid: the model's chat template never reads "
            f"{name} (it reads: {', '.join(sorted(read))})"
        )
    return kwargs


def check_prompt_lengths(
    task: ReasoningTaskConfig, source: PromptSource, tokenizer: Any, context: int, max_new_tokens: int, model: str
) -> tuple[int, int] | None:
    """Refuse a task with prompts that, as the model is asked them (`encode_prompts`), are longer than
    task.max_prompt_length, or leave no room for `max_new_tokens` in the model's `context`: the generation engines
    refuse such a batch (`check_lengths`), which would stop the run in a worker, mid-run. Checked: the held-out set,
    and every training problem of a source that holds a known number of them (`num_train`: a data file's records); a
    source that makes its problems on the fly (arithmetic) draws its held-out set from the same distribution as its
    training batches. The error names rollout.max_new_tokens when a smaller one would fit every prompt, else the
    data. With task.truncation cutting prompts, returns how many training and held-out prompts are cut (from the
    one rendering the check needs: `count_truncated` renders them again)."""
    splits = {"eval": source.eval_set()}
    if isinstance(getattr(source, "num_train", None), int):
        splits["train"] = source.train_batch(0, source.num_train)  # epoch 0: each training problem once
    whole = {
        split: [len(ids) for ids in render_prompts(tokenizer, problems, task)] for split, problems in splits.items()
    }
    limit = getattr(task, "max_prompt_length", None)
    cut = None
    lengths = whole
    if getattr(task, "truncation", "error") != "error":  # as encode_prompts cuts them, counted
        cut = (sum(n > limit for n in whole.get("train", [])), sum(n > limit for n in whole["eval"]))
        lengths = {split: [min(n, limit) for n in ns] for split, ns in whole.items()}
    longest, split, index = max((n, split, i) for split, ns in lengths.items() for i, n in enumerate(ns))
    prompt = splits[split][index].prompt[:40]
    if limit is not None and longest > limit:
        over = sum(n > limit for n in lengths[split])
        key, value = task.origin(split)
        raise ConfigError(
            f"task.max_prompt_length = {limit} is invalid with {key} = {value!r}: {over} of "
            f"its {len(splits[split])} {split} prompts {'is' if over == 1 else 'are'} longer; the longest has "
            f"{longest} tokens ({prompt!r}) (valid: {longest} or more, task.filter_overlong_prompts=true to leave "
            "them out, or task.truncation=left|right|middle to cut them)"
        )
    if longest + max_new_tokens <= context:
        return cut
    if longest < context:
        raise ConfigError(
            f"rollout.max_new_tokens = {max_new_tokens} is invalid with model.path = {model!r}: its context of "
            f"{context} tokens leaves room for {context - longest} after the longest {split} prompt ({longest} "
            f"tokens, {prompt!r}) (valid: 1 to {context - longest}, or shorter prompts)"
        )
    key, value = task.origin(split)
    over = sum(n + max_new_tokens > context for n in lengths[split])
    raise ConfigError(
        f"{key} = {value!r} is invalid with model.path = {model!r}: {over} of "
        f"its {len(splits[split])} {split} prompts {'does' if over == 1 else 'do'} not fit the model's context of "
        f"{context} tokens with rollout.max_new_tokens = {max_new_tokens} after them; the longest has {longest} "
        f"tokens ({prompt!r}): shorten or drop such records"
    )
