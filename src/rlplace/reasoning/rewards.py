"""Rewards of reasoning tasks: functions `(prompt, response, answer, extra) -> float | {name: float}`, registered by
name, or named by `package.module:function` or `path/to/file.py:function`.

`reward.function` picks one (None: the task's default, `ReasoningTaskConfig.default_reward`), checked on the driver
(importable, callable) before any worker starts. A reward returns the training reward as a float, or a dict of named
scores whose `"score"` entry is the training reward and whose every entry is logged per step as `reward/<name>` (a
float is logged as `reward/score`). Everything that scores (the reward workers, evaluation, pretraining) goes through
`RewardFunction.__call__`, so they all score, and refuse a malformed result, alike.

A function written for verl, `compute_score(data_source, solution_str, ground_truth, extra_info)`, is recognised by
its first parameter and called as verl calls it, with the record's `data_source` and `extra_info` fields
(`VerlReward`), so verl's rewards and preprocessed files work unchanged. One written for OpenRLHF (`--remote_rm_url
reward_func.py`), `reward_func(queries, prompts, labels)`, is recognised the same way and called once per batch as
OpenRLHF calls it (`OpenRLHFReward`); so is a reward server at an `http(s)://` URL (OpenRLHF's `--remote_rm_url
http://...`, `RemoteReward`). Any other function must accept `(prompt, response, answer, extra)`, checked on the
driver.

The built-ins: `exact_match` (the arithmetic task's), `gsm8k` (the number after the last `####`), `boxed` (the last
`\\boxed{...}`, compared by math-verify), `format` (the answer ends in one of those two forms), and
`gsm8k_with_format` / `boxed_with_format` (correctness plus a small format bonus, `with_format`).
"""

from __future__ import annotations

import inspect
import json
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry, load_function

if TYPE_CHECKING:
    from rlplace.reasoning.tasks.prompts import Problem

Reward = Callable[[str, str, str, Mapping[str, Any]], float | Mapping[str, float]]
"""A reward: the prompt, the response (decoded without special tokens), the reference answer and the problem's other
fields (`Problem.extra`) -> a score (1.0 is right), or named scores with the training reward under "score"."""

Scores = dict[str, float]
"""Named scores of one response; "score" is the training reward."""

SCORE = "score"
"""The entry of a reward's dict that is the training reward (and the name a float reward is logged under)."""

METRIC_PREFIX = "reward/"
"""A run logs each named score as `reward/<name>`, its mean over the step's responses: the reward workers sum it over
a micro-batch's rows into `SequenceBatch.meta`, and the runner divides by the rows."""

ANSWER_END = "\n"
"""`exact_match`: a response's answer ends at its first newline. The model's EOS token is dropped when the response is
decoded without special tokens; anything the model writes after its answer on the same line makes the answer wrong."""

MATH_VERIFY_TIMEOUT_S = 5
"""`boxed`: seconds math-verify may spend parsing one expression and comparing two (sympy can hang on input such as a
tower of exponents). Its timeout is a SIGALRM, which only the main thread may set: elsewhere it runs without one."""

FORMAT_BONUS = 0.1
"""`*_with_format`: what a well-formed answer adds to the correctness reward (1.0); small, so that the format is
learnt early without ever being worth as much as a right answer."""

KEY = "reward.function"
"""The config key that names a reward."""

REWARDS: Registry[Reward] = Registry(KEY)


@REWARDS.register("exact_match")
def exact_match(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> float:
    """1.0 if the response's answer equals `answer`, else 0.0.

    The response is cut at its first newline (`ANSWER_END`) and stripped of surrounding whitespace; nothing else is
    normalised, so "082" or "82.0" do not match "82"."""
    return 1.0 if response.split(ANSWER_END, 1)[0].strip() == answer else 0.0


GSM8K_MARK = "####"
"""GSM8K's answer marker: a solution ends with `#### <number>`."""
GSM8K_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)")
"""The number right after the marker, once commas and `$` are removed."""


def gsm8k_number(text: str) -> str | None:
    """The number after the last `####` of `text`, normalised (no commas or `$`, no trailing decimal zeros:
    "$1,234.50" -> "1234.5", "72.0" -> "72"); None without a marker or a number right after it."""
    _, mark, tail = text.rpartition(GSM8K_MARK)
    found = GSM8K_NUMBER.match(tail.replace(",", "").replace("$", "")) if mark else None
    if found is None:
        return None
    number = found.group(1)
    return number.rstrip("0").rstrip(".") if "." in number else number


@REWARDS.register("gsm8k")
def gsm8k(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> float:
    """1.0 if the number after the response's last `####` is the reference's. The reference may be a bare number
    ("72") or a whole GSM8K solution ending in `#### 72`; both sides are normalised by `gsm8k_number`."""
    reference = gsm8k_number(answer if GSM8K_MARK in answer else f"{GSM8K_MARK} {answer}")
    found = gsm8k_number(response)
    return 1.0 if found is not None and found == (reference or answer.strip()) else 0.0


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` of `text` (braces matched, so `\\boxed{\\frac{1}{2}}` gives
    `\\frac{1}{2}`); None when there is none or it is not closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, first = 0, start + len("\\boxed{")
    for i in range(first, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[first:i]
    return None


@REWARDS.register("boxed")
def boxed(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> float:
    """1.0 if the last `\\boxed{...}` of the response equals the answer mathematically (math-verify: `\\frac{1}{2}`
    is `0.5`, `1+x` is `x+1`). The answer is read as LaTeX math (`$...$` added), so "0.5" and "\\frac{1}{2}" both
    work. Unparseable input or a timeout scores 0.0."""
    content = last_boxed(response)
    if content is None:
        return 0.0
    from math_verify import parse, verify  # sympy: imported where a response is verified, not with the config

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${answer}$", parsing_timeout=timeout)
    found = parse(f"${content}$", parsing_timeout=timeout)
    return 1.0 if gold and found and verify(gold, found, timeout_seconds=timeout) else 0.0


REWARDS.register("math", boxed)

GSM8K_LINE = re.compile(r"####\s*\$?-?[\d,]*\.?\d+\s*")
"""`format`: a whole line giving a GSM8K answer, `#### 1,234.5` (a `$` and commas allowed, as `gsm8k` reads them)."""


@REWARDS.register("format")
def answer_format(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> float:
    """1.0 when the response's last non-empty line gives its answer in an expected form, a `#### <number>` line or a
    closed `\\boxed{...}`, whether or not the answer is right; else 0.0."""
    lines = response.strip().splitlines()
    last = lines[-1] if lines else ""
    return 1.0 if GSM8K_LINE.fullmatch(last) or last_boxed(last) is not None else 0.0


def with_format(correct: Callable[[str, str, str, Mapping[str, Any]], float], bonus: float = FORMAT_BONUS) -> Reward:
    """A reward of `correct` (a float reward) plus `bonus` x `format`, as named scores {"score", "correct",
    "format"}, so that each part is logged (`reward/correct`, `reward/format`). For another weight, bind your own in a
    module of yours: `my_reward = with_format(gsm8k, bonus=0.2)`, then `reward.function=my_pkg.rewards:my_reward`."""

    def combined(prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> Scores:
        right = float(correct(prompt, response, answer, extra))
        formed = answer_format(prompt, response, answer, extra)
        return {SCORE: right + bonus * formed, "correct": right, "format": formed}

    return combined


REWARDS.register("gsm8k_with_format", with_format(gsm8k))
REWARDS.register("boxed_with_format", with_format(boxed))


MODEL = "model"
RULE = "rule"


def with_model(rule: Scores, model: float, weight: float) -> Scores:
    """A rule reward's scores joined with a reward model's (`reward.model_path`): the training reward is
    (1 - weight) x the rule's score + weight x the model's; the rule's score and the model's are kept as "rule" and
    "model" (logged as `reward/rule`, `reward/model`), and the rule's other names as they are."""
    return {**rule, RULE: rule[SCORE], MODEL: model, SCORE: (1 - weight) * rule[SCORE] + weight * model}


INTERACTION = "interaction"
"""The named score `with_interaction` adds (`reward/interaction`)."""


def with_interaction(scores: Scores, interaction: float, weight: float) -> Scores:
    """`scores` with the interaction's (`rollout.multi_turn.interaction`: its scores of the response's turns, summed)
    added to the training reward at `weight` and kept as "interaction"."""
    return {**scores, INTERACTION: interaction, SCORE: scores[SCORE] + weight * interaction}


OVERLONG = "overlong_penalty"
"""The named score `with_overlong_penalty` adds (`reward/overlong_penalty`)."""


def with_overlong_penalty(scores: Scores, length: int, max_new_tokens: int, buffer: int, factor: float) -> Scores:
    """`scores` with DAPO's soft overlong punishment (Yu et al. 2025) added to the training reward and kept as
    "overlong_penalty": 0 up to `max_new_tokens - buffer` tokens, then falling linearly to `-factor` at
    `max_new_tokens`, so that the policy learns to finish before it is cut off instead of being scored on a cut
    answer alone."""
    penalty = min(0.0, (max_new_tokens - buffer - length) / buffer * factor)
    return {**scores, OVERLONG: penalty, SCORE: scores[SCORE] + penalty}


class Decoded(NamedTuple):
    """A batch's responses as text, in the forms rewards read."""

    responses: list[str]
    """Each response without special tokens: what `(prompt, response, answer, extra)` rewards get."""
    prompts: list[str]
    """Each prompt as the model was asked it (system prompt and chat template rendered), special tokens kept."""
    queries: list[str]
    """Prompt and response together, special tokens kept (the response's end token included): OpenRLHF's
    `queries`. Prompts and queries are decoded only for a reward that reads them (`RewardFunction.decode`)."""


@dataclass(frozen=True)
class RewardFunction:
    """The reward `reward.function` names, and the one way every part of a run scores a response with it."""

    spec: str
    """The `reward.function` value it was loaded from (named in errors)."""
    function: Reward | OpenRLHFReward
    """A reward of one response, or an OpenRLHF one of a batch (which `scores` calls, `__call__` cannot)."""

    def __call__(self, prompt: str, response: str, answer: str, extra: Mapping[str, Any]) -> Scores:
        """The named scores of `response`: a float reward becomes {"score": it}. TypeError naming `reward.function`
        when the result is neither a number nor a dict of numbers with a "score" entry."""
        value = self.function(prompt, response, answer, extra)
        named = value if isinstance(value, Mapping) else {SCORE: value}
        if SCORE not in named or not all(isinstance(v, int | float) for v in named.values()):
            raise TypeError(
                f"{KEY} = {self.spec!r} returned {value!r}: a reward returns a number, or a dict of numbers "
                f'whose "{SCORE}" entry is the training reward'
            )
        return {name: float(v) for name, v in named.items()}

    def decode(self, tokenizer: Any, prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]]) -> Decoded:
        """The texts this reward reads of unpadded prompt and response token ids: the responses; the prompts and the
        queries too for an OpenRLHF reward (empty otherwise: decoding them costs per micro-batch)."""
        responses = tokenizer.batch_decode(list(response_ids), skip_special_tokens=True)
        if not isinstance(self.function, OpenRLHFReward):
            return Decoded(responses, [], [])
        queries = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        return Decoded(responses, tokenizer.batch_decode(list(prompt_ids)), tokenizer.batch_decode(queries))

    def scores(self, problems: Sequence[Problem], decoded: Decoded) -> list[Scores]:
        """The named scores of each response to its problem: one call per response, or one per batch for an OpenRLHF
        function. ValueError naming `reward.function` when two responses get different names: `reward/<name>` is a
        mean over every response of the step."""
        if isinstance(self.function, OpenRLHFReward):
            scored = self.function.scores(self.spec, decoded, [p.answer for p in problems])
        else:
            pairs = zip(problems, decoded.responses, strict=True)
            scored = [self(p.prompt, response, p.answer, p.extra) for p, response in pairs]
        names = {tuple(s) for s in scored}
        if len(names) > 1:
            raise ValueError(
                f"{KEY} = {self.spec!r} returned different names for different responses "
                f"({' vs '.join(map(str, sorted(names)))}): every response must get the same ones"
            )
        return scored


VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth")
"""The first parameters of a verl reward (`verl.utils.reward_score.default_compute_score`'s signature)."""


@dataclass(frozen=True)
class VerlReward:
    """A verl reward called as verl's reward manager calls it: by keyword, `data_source` and `extra_info` taken from
    the problem's record (None where it has none), `extra_info` only if the function takes it."""

    function: Callable[..., float | Mapping[str, float]]
    takes_extra_info: bool

    def __call__(
        self, prompt: str, response: str, answer: str, extra: Mapping[str, Any]
    ) -> float | Mapping[str, float]:
        given = {"data_source": extra.get("data_source"), "solution_str": response, "ground_truth": answer}
        if self.takes_extra_info:
            given["extra_info"] = extra.get("extra_info")
        return self.function(**given)


OPENRLHF_PARAMETERS = ("queries", "prompts", "labels")
"""The parameters of an OpenRLHF reward function (`reward_func` of the file `--remote_rm_url` names)."""


@dataclass(frozen=True)
class OpenRLHFReward:
    """A reward written for OpenRLHF, called once per batch as OpenRLHF calls it: `queries` (prompt and response
    with special tokens), `prompts` (as the model was asked them), `labels` (the reference answers). It returns the
    rewards (a tensor, array or list), or a dict of them under "rewards" with per-response `extra_logs`, each logged
    as `reward/<name>`. Its "scores" (OpenRLHF filters groups on them) are not read: `algorithm.filter_groups` filters
    on the training reward."""

    function: Callable[..., Any]

    def scores(self, spec: str, decoded: Decoded, labels: list[str]) -> list[Scores]:
        """Each response's named scores; TypeError naming `reward.function` for a result of another shape."""
        rows = len(labels)
        value = self.function(decoded.queries, decoded.prompts, labels)
        named = {SCORE: value.get("rewards"), **(value.get("extra_logs") or {})} if isinstance(value, Mapping) else {}
        columns = {name: _per_row(values, rows) for name, values in (named or {SCORE: value}).items()}
        if any(column is None for column in columns.values()):
            raise TypeError(
                f"{KEY} = {spec!r} returned {value!r}: an OpenRLHF reward returns {rows} rewards (a tensor, array or "
                'list), or a dict with them under "rewards" and an "extra_logs" dict of as many values per name'
            )
        return [{name: column[i] for name, column in columns.items()} for i in range(rows)]  # type: ignore[index]


REMOTE_SCHEMES = ("http://", "https://")
"""A `reward.function` starting with one of these is the URL of a reward server (`RemoteReward`)."""
REMOTE_TIMEOUT_S = 180.0
"""How long one request to a reward server may take (a reward model scoring a batch under load, as OpenRLHF allows)."""
REMOTE_TRIES = 3
"""Requests to a reward server per batch before the step fails: a server restarting or briefly overloaded is waited
for (1 s, then 2 s), one that stays down is reported."""


@dataclass(frozen=True)
class RemoteReward:
    """A reward server, called as OpenRLHF calls one (`--remote_rm_url`): each batch POSTed as JSON `{"query":
    queries, "prompts": prompts, "labels": labels}`, the answer a JSON object with the rewards under "rewards" and
    optional per-response "extra_logs" (read by `OpenRLHFReward`), as OpenRLHF's `serve_rm` and servers written for
    it give."""

    url: str

    def __call__(self, queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        body = json.dumps({"query": queries, "prompts": prompts, "labels": labels}).encode()
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        tries = 0
        while True:
            try:
                with urllib.request.urlopen(request, timeout=REMOTE_TIMEOUT_S) as answer:
                    return json.loads(answer.read())
            except (OSError, ValueError) as error:  # unreachable, an error status, a timeout, an answer not JSON
                tries += 1
                if tries == REMOTE_TRIES:
                    raise RuntimeError(f"{KEY} = {self.url!r}: no answer after {tries} tries: {error}") from None
                time.sleep(2.0 ** (tries - 1))


def check_remote_reward(spec: str) -> None:
    """Refuse, before any worker starts, a reward server's URL where nothing accepts a connection (ConfigError, one
    line naming `reward.function`); any other reward passes."""
    if not spec.startswith(REMOTE_SCHEMES):
        return
    url = urllib.parse.urlsplit(spec)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=5.0).close()
    except OSError as error:
        raise ConfigError(
            f"{KEY} = {spec!r} is invalid: nothing accepts a connection at {url.hostname}:{port} ({error}); valid: "
            "the URL of a running reward server"
        ) from None


def _per_row(values: Any, rows: int) -> list[float] | None:
    """`values` (a tensor, array or sequence of `rows` numbers) as floats; None when it is not that."""
    values = values.tolist() if hasattr(values, "tolist") else values
    if not isinstance(values, Sequence) or len(values) != rows or not all(isinstance(v, int | float) for v in values):
        return None
    return [float(v) for v in values]


def _callable_as_reward(spec: str, found: Callable[..., Any]) -> Reward | OpenRLHFReward:
    """`found` as a reward: an OpenRLHF or verl reward adapted (`OpenRLHFReward`, `VerlReward`), any other checked to
    accept (prompt, response, answer, extra). ConfigError naming `reward.function` when it cannot."""
    try:
        signature = inspect.signature(found)
    except (TypeError, ValueError):  # a callable without a signature Python can read: called as it is
        return found
    parameters = signature.parameters
    if tuple(parameters)[: len(OPENRLHF_PARAMETERS)] == OPENRLHF_PARAMETERS:
        return OpenRLHFReward(found)
    if tuple(parameters)[: len(VERL_PARAMETERS)] == VERL_PARAMETERS:
        takes = "extra_info" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        return VerlReward(found, takes_extra_info=takes)
    try:
        signature.bind("prompt", "response", "answer", {})
    except TypeError as error:
        raise ConfigError(
            f"{KEY} = {spec!r} cannot be called as a reward ({error}); valid: a function of (prompt, response, "
            f"answer, extra), verl's ({', '.join(VERL_PARAMETERS)}, extra_info) or OpenRLHF's "
            f"({', '.join(OPENRLHF_PARAMETERS)})"
        ) from None
    return found


def reward_function(spec: str) -> RewardFunction:
    """The reward `spec` names: a registered name, `package.module:function` (imported by `core.registry.load`),
    `path/to/file.py:function` (a file of your own, run by `core.registry.load_file`) or a reward server's URL.
    ConfigError in one line naming `reward.function`, the value and what is valid when it is none of them, cannot be
    loaded, or is not callable."""
    valid = (
        f"valid: {', '.join(REWARDS.names())}, package.module:function, path/to/file.py:function or the http(s):// URL "
        "of a reward server"
    )
    if spec.startswith(REMOTE_SCHEMES):
        if not urllib.parse.urlsplit(spec).hostname:
            raise ConfigError(f"{KEY} = {spec!r} is invalid: a URL names its host; {valid}")
        return RewardFunction(spec, OpenRLHFReward(RemoteReward(spec)))
    what = "a reward is a function (prompt, response, answer, extra) -> float or dict of floats"
    found = load_function(REWARDS, spec, valid, what)
    if ":" not in spec:
        return RewardFunction(spec, found)
    return RewardFunction(spec, _callable_as_reward(spec, found))
