"""ArithmeticTask: deterministic batches by (seed, step), a held-out eval set, digit ranges, correct answers."""

from __future__ import annotations

import os
import re
import string
import subprocess
import sys
from collections import Counter

import pytest

from rlplace.reasoning.tasks.arithmetic import ArithmeticTask
from rlplace.reasoning.tasks.prompts import Problem, PromptSource

PROMPT = re.compile(r"^(0|[1-9]\d*)([+\-*])(0|[1-9]\d*)=$")


def _parse(prompt: str) -> tuple[int, str, int]:
    match = PROMPT.match(prompt)
    assert match is not None, f"prompt {prompt!r} is not '<a><op><b>='"
    return int(match[1]), match[2], int(match[3])


def _expected(problem: Problem) -> str:
    a, op, b = _parse(problem.prompt)
    return str({"+": a + b, "-": a - b, "*": a * b}[op])


def test_is_a_prompt_source() -> None:
    assert isinstance(ArithmeticTask(seed=0), PromptSource)


def test_same_seed_and_step_give_the_same_batch_whatever_came_before() -> None:
    fresh, used = ArithmeticTask(seed=3), ArithmeticTask(seed=3)
    for step in (9, 0, 4, 4):
        used.train_batch(step, 50)
    assert used.train_batch(7, 64) == fresh.train_batch(7, 64)
    assert used.eval_set() == fresh.eval_set()


def test_batches_do_not_depend_on_the_process_hash_seed() -> None:
    code = (
        "from rlplace.reasoning.tasks.arithmetic import ArithmeticTask; print(ArithmeticTask(seed=5).train_batch(2, 8))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for hash_seed in ("1", "2")
    }
    assert outputs == {repr(ArithmeticTask(seed=5).train_batch(2, 8)) + "\n"}


def test_steps_and_seeds_give_different_batches() -> None:
    task = ArithmeticTask(seed=0)
    assert task.train_batch(0, 32) != task.train_batch(1, 32)
    assert task.train_batch(0, 32) != ArithmeticTask(seed=1).train_batch(0, 32)
    assert task.eval_set() != ArithmeticTask(seed=1).eval_set()


def test_a_smaller_batch_is_a_prefix_of_a_larger_one() -> None:
    task = ArithmeticTask(seed=0)
    assert task.train_batch(3, 40)[:10] == task.train_batch(3, 10)
    assert task.train_batch(3, 0) == []


def test_eval_set_is_fixed_distinct_and_of_the_asked_size() -> None:
    task = ArithmeticTask(seed=2, eval_size=150)
    problems = task.eval_set()
    assert len(problems) == 150
    assert len({p.prompt for p in problems}) == 150
    problems.clear()  # the caller gets a copy
    assert task.eval_set() == ArithmeticTask(seed=2, eval_size=150).eval_set()


def test_train_never_holds_an_eval_prompt_and_covers_the_rest_of_a_tiny_space() -> None:
    # One-digit + and -: 200 distinct problems, half held out; training reaches exactly the other half.
    task = ArithmeticTask(seed=1, min_digits=1, max_digits=1, operations="+-", eval_size=100)
    eval_prompts = {p.prompt for p in task.eval_set()}
    train_prompts = {p.prompt for step in range(300) for p in task.train_batch(step, 64)}
    assert len(eval_prompts) == 100
    assert train_prompts.isdisjoint(eval_prompts)
    every = {f"{a}{op}{b}=" for a in range(10) for b in range(10) for op in "+-"}
    assert train_prompts == every - eval_prompts


def test_train_and_eval_disjoint_with_the_default_settings() -> None:
    task = ArithmeticTask(seed=0)
    eval_prompts = {p.prompt for p in task.eval_set()}
    assert all(p.prompt not in eval_prompts for step in range(200) for p in task.train_batch(step, 256))


@pytest.mark.parametrize("operations", ["+", "-", "*", "+-", "+-*"])
def test_answers_are_correct_and_only_the_chosen_operations_appear(operations: str) -> None:
    task = ArithmeticTask(seed=4, min_digits=1, max_digits=3, operations=operations)
    problems = task.train_batch(0, 2000) + task.eval_set()
    for problem in problems:
        assert problem.answer == _expected(problem), problem
    assert {_parse(p.prompt)[1] for p in problems} == set(operations)


def test_subtraction_may_go_below_zero() -> None:
    problems = ArithmeticTask(seed=0, operations="-").train_batch(0, 500)
    negative = [p for p in problems if p.answer.startswith("-")]
    assert negative and all(int(p.answer) < 0 for p in negative)


@pytest.mark.parametrize(("min_digits", "max_digits"), [(1, 1), (1, 3), (2, 4), (5, 5), (9, 9)])
def test_operand_digits_stay_in_range_and_each_length_is_drawn_uniformly(min_digits: int, max_digits: int) -> None:
    task = ArithmeticTask(seed=6, min_digits=min_digits, max_digits=max_digits, operations="+-*", eval_size=40)
    lengths: Counter[int] = Counter()
    for problem in task.train_batch(0, 3000):
        a, _, b = _parse(problem.prompt)
        lengths.update((len(str(a)), len(str(b))))
    assert set(lengths) == set(range(min_digits, max_digits + 1))
    share = 1 / (max_digits - min_digits + 1)
    for count in lengths.values():
        assert abs(count / 6000 - share) < 0.03, lengths


def test_operation_order_does_not_matter() -> None:
    assert ArithmeticTask(seed=0, operations="*-+").train_batch(1, 30) == ArithmeticTask(
        seed=0, operations="+-*"
    ).train_batch(1, 30)


def test_problems_are_printable_ascii_without_spaces() -> None:
    allowed = set(string.digits + "+-*=")
    task = ArithmeticTask(seed=0, min_digits=1, max_digits=9, operations="+-*")
    for problem in task.train_batch(0, 500) + task.eval_set():
        assert set(problem.prompt) <= allowed and set(problem.answer) <= allowed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_digits": 0}, "task.min_digits = 0 is invalid: need 1 <= task.min_digits <= task.max_digits <= 9"),
        ({"min_digits": 10, "max_digits": 10}, "task.min_digits = 10 is invalid"),
        ({"max_digits": 10}, "task.max_digits = 10 is invalid: need 1 <= task.min_digits (= 1) <= task.max_digits"),
        ({"min_digits": 3, "max_digits": 2}, "task.max_digits = 2 is invalid: need 1 <= task.min_digits (= 3)"),
        ({"operations": ""}, "task.operations = '' is invalid: a non-empty string of distinct characters from '+-*'"),
        ({"operations": "+/"}, "task.operations = '+/' is invalid"),
        ({"operations": "++"}, "task.operations = '++' is invalid"),
        ({"eval_size": 0}, "task.eval_size = 0 is invalid: between 1 and 10000"),
        (
            {"min_digits": 1, "max_digits": 1, "operations": "+-", "eval_size": 200},
            "task.eval_size = 200 is invalid: between 1 and 100: at most half of the 200 distinct problems",
        ),
        ({"min_digits": 1, "max_digits": 1, "operations": "*", "eval_size": 51}, "between 1 and 50"),
    ],
)
def test_invalid_settings_are_refused_naming_the_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ArithmeticTask(seed=0, **kwargs)


def test_the_largest_allowed_eval_set_leaves_training_the_other_half() -> None:
    task = ArithmeticTask(seed=0, min_digits=1, max_digits=1, operations="*", eval_size=50)
    assert len(task.eval_set()) == 50
    assert len({p.prompt for step in range(100) for p in task.train_batch(step, 32)}) == 50


@pytest.mark.parametrize(("step", "num_prompts", "message"), [(-1, 4, "step = -1"), (0, -2, "num_prompts = -2")])
def test_negative_step_or_batch_size_is_refused(step: int, num_prompts: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArithmeticTask(seed=0).train_batch(step, num_prompts)
