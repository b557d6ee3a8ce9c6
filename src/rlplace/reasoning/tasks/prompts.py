"""Prompt sources for reasoning RL: the problem record, the source protocol, and a task read from JSONL files.

A reasoning run does not step a simulator: each step it asks a `PromptSource` for a batch of problems, the rollout
group writes a response per prompt, and the `reward` section's function turns each response into a reward.
Batches are a pure function
of (seed, step), drawn from a stream seeded through SHA-256 rather than Python's per-process salted `hash()`, so any
worker on any node that asks for step `s` gets the same problems, and a resumed run continues where it stopped
without replaying the calls before it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlplace.core.errors import ConfigError, check
from rlplace.reasoning.rewards import ANSWER_END

from .registry import ReasoningTaskConfig


@dataclass(frozen=True)
class Problem:
    """One prompt and the answer a correct response gives, e.g. `Problem("37+45=", "82")`."""

    prompt: str
    answer: str
    extra: Mapping[str, Any] = field(default_factory=dict)


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


class JsonlTask:
    """Problems read from JSON Lines files, one `{"prompt": ..., "answer": ...}` object per line.

    A numeric answer is converted with `str()` (`82` -> "82", `2.5` -> "2.5"; note `3.0` -> "3.0", write "3" for an
    integer answer). String answers are stripped; an answer must be non-empty and fit on one line, since `exact_match`
    stops reading a response at its first newline. Blank lines are skipped.

    Held-out split: with `eval_path`, the whole eval file is the eval set (`eval_size` is then unused). Without it,
    `eval_size` lines of the train file, chosen by a stream seeded with `seed` and kept in file order, are held out.
    Either way, every training line whose prompt appears in the eval set is dropped, so a prompt repeated in the
    files never leaks from eval into training.

    Training batches walk through the training problems epoch by epoch: epoch `e` is a permutation seeded by
    (seed, e), so each problem is drawn exactly once per epoch. Batch `step` holds positions
    [step * num_prompts, (step + 1) * num_prompts) of that endless sequence; it assumes the runner keeps
    `num_prompts` fixed over a run (a changed size re-slices the sequence, still deterministically).
    """

    def __init__(self, train_path: str, eval_path: str | None, seed: int, eval_size: int = 200) -> None:
        self.seed = seed
        problems = read_problems(train_path, "task.train_path")
        if eval_path is None:
            check(
                1 <= eval_size < len(problems),
                "task.eval_size",
                eval_size,
                f"between 1 and {len(problems) - 1}: the lines held out of task.train_path = {train_path!r} "
                f"({len(problems)} problems, at least one of which must remain for training)",
            )
            held_out = sorted(seeded_rng(seed, "eval").sample(range(len(problems)), eval_size))
            self._eval = [problems[i] for i in held_out]
        else:
            self._eval = read_problems(eval_path, "task.eval_path")
        eval_prompts = {p.prompt for p in self._eval}
        self._train = [p for p in problems if p.prompt not in eval_prompts]
        check(
            bool(self._train),
            "task.train_path",
            train_path,
            "every prompt in it is also in the eval set, so nothing is left to train on",
        )
        self._order_epoch = -1
        self._order: list[int] = []

    @property
    def num_train(self) -> int:
        """Training problems in one epoch."""
        return len(self._train)

    def train_batch(self, step: int, num_prompts: int) -> list[Problem]:
        check_batch_request(step, num_prompts)
        batch = []
        for position in range(step * num_prompts, (step + 1) * num_prompts):
            epoch, index = divmod(position, len(self._train))
            batch.append(self._train[self._epoch_order(epoch)[index]])
        return batch

    def eval_set(self) -> list[Problem]:
        return list(self._eval)

    def _epoch_order(self, epoch: int) -> list[int]:
        """The permutation of training problems for `epoch`; the latest one is kept, as batches walk forward."""
        if epoch != self._order_epoch:
            order = list(range(len(self._train)))
            seeded_rng(self.seed, "epoch", epoch).shuffle(order)
            self._order_epoch, self._order = epoch, order
        return self._order


def read_problems(path: str | Path, key: str) -> list[Problem]:
    """Read a JSONL problem file; refuse, naming `key` and `file:line`, a missing file, a bad line or no problems."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key} = {str(path)!r} is invalid: no such file")
    problems = []
    with file.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"{key}: {file}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ConfigError(f"{where}: not UTF-8 text ({err.reason})") from err
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ConfigError(f"{where}: not valid JSON ({err.msg}); expected one object per line") from err
            if not isinstance(record, dict):
                raise ConfigError(f'{where}: expected a JSON object with "prompt" and "answer", got {line.strip()!r}')
            for name in ("prompt", "answer"):
                if name not in record:
                    raise ConfigError(f'{where}: missing key "{name}" (a line needs "prompt" and "answer")')
            problems.append(Problem(prompt=_prompt(record["prompt"], where), answer=_answer(record["answer"], where)))
    if not problems:
        raise ConfigError(f"{key} = {str(path)!r} is invalid: the file holds no problems (it is empty)")
    return problems


def _prompt(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f'{where}: "prompt" must be a non-empty string, got {value!r}')
    return value


def _answer(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f'{where}: "answer" must be a string or a number, got {value!r}')
    answer = str(value).strip()
    if not answer or ANSWER_END in answer:
        raise ConfigError(f'{where}: "answer" must be non-empty and on one line, got {value!r}')
    return answer


@dataclass
class JsonlTaskConfig(ReasoningTaskConfig):
    """`task=jsonl`: your own problems, `{"prompt": ..., "answer": ...}` lines (`JsonlTask`)."""

    name: str = "jsonl"
    train_path: str | None = None
    """`{"prompt": ..., "answer": ...}` lines to train on."""
    eval_path: str | None = None
    """Held-out lines; None holds out eval_size lines of train_path."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.train_path is not None, "task.train_path", self.train_path, "a jsonl file for task=jsonl")

    def prompt_source(self) -> JsonlTask:
        assert self.train_path is not None, "JsonlTaskConfig refuses a missing train_path"
        return JsonlTask(self.train_path, self.eval_path, seed=self.data_seed, eval_size=self.eval_size)
