"""Arithmetic problems generated on the fly: a verifiable reasoning task that needs no data files.

Each problem is `f"{a}{op}{b}="` with answer `str(result)`, no spaces, e.g. "37+45=" -> "82", so every character is
a digit, an operator or "=" and a character-level tokenizer covers it. The task's difficulty is set by the number of
digits of the operands and by the operations.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from dataclasses import dataclass

from rlplace.core.errors import check

from .prompts import Problem, check_batch_request, seeded_rng
from .registry import ReasoningTaskConfig

OPERATIONS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
"""Operator character -> its integer function, in canonical order."""
MAX_DIGITS = 9
"""Operands stay below one billion, so prompts and answers stay short for a small character-level model."""


class ArithmeticTask:
    """Multi-digit addition, subtraction and multiplication of non-negative integers (a `PromptSource`).

    Each operand first draws its number of digits uniformly from [min_digits, max_digits], then a uniform integer with
    exactly that many digits (0-9 for one digit, 10-99 for two, ...), so short operands are not swamped by the far more
    numerous long ones. The operation is drawn uniformly from `operations` (order does not matter: "-+" is "+-").
    Subtraction may go below zero: "3-10=" has the answer "-7".

    Held-out split: the eval set is `eval_size` distinct problems drawn from a stream seeded by (seed, "eval"),
    separate from the training stream; a training draw whose prompt is in the eval set is drawn again, so no
    training batch ever holds an eval prompt. Training batches sample with replacement: a prompt may repeat within
    and across steps. When the problem space is small (one-digit operands give 100 distinct pairs per operation),
    eval_size distinct problems may not exist, and taking most of the space would leave training little besides
    rejections; so eval_size is refused (ValueError naming `task.eval_size`) above half of the distinct problems,
    and the eval set always holds exactly eval_size problems. Being drawn from the same distribution, the eval set
    holds the likeliest problems, so redraws cost more than its share of the space suggests, most of all near the
    cap.
    """

    def __init__(
        self,
        seed: int,
        min_digits: int = 1,
        max_digits: int = 2,
        operations: str = "+-",
        eval_size: int = 200,
    ) -> None:
        check(
            1 <= min_digits <= MAX_DIGITS,
            "task.min_digits",
            min_digits,
            f"need 1 <= task.min_digits <= task.max_digits <= {MAX_DIGITS}",
        )
        check(
            min_digits <= max_digits <= MAX_DIGITS,
            "task.max_digits",
            max_digits,
            f"need 1 <= task.min_digits (= {min_digits}) <= task.max_digits <= {MAX_DIGITS}",
        )
        check(
            isinstance(operations, str)
            and len(operations) > 0
            and set(operations) <= set(OPERATIONS)
            and len(set(operations)) == len(operations),
            "task.operations",
            operations,
            f"a non-empty string of distinct characters from {''.join(OPERATIONS)!r}",
        )
        self.seed, self.min_digits, self.max_digits = seed, min_digits, max_digits
        self.operations = "".join(op for op in OPERATIONS if op in operations)
        # Every (a, op, b) gives a different prompt; the eval set may take at most half of them.
        self.num_problems = len(self.operations) * self._num_operands() ** 2
        max_eval = self.num_problems // 2
        check(
            1 <= eval_size <= max_eval,
            "task.eval_size",
            eval_size,
            f"between 1 and {max_eval}: at most half of the {self.num_problems} distinct problems "
            f"with task.min_digits={min_digits}, task.max_digits={max_digits}, task.operations={self.operations!r}",
        )
        self.eval_size = eval_size
        self._operand_ranges = [(0 if d == 1 else 10 ** (d - 1), 10**d) for d in range(min_digits, max_digits + 1)]
        self._eval = self._draw_eval()
        self._eval_prompts = frozenset(p.prompt for p in self._eval)

    def train_batch(self, step: int, num_prompts: int) -> list[Problem]:
        """`num_prompts` problems for `step`, drawn from a stream seeded by (seed, "train", step) alone.

        The stream does not depend on num_prompts, so a smaller batch of the same step is a prefix of a larger one.
        """
        check_batch_request(step, num_prompts)
        rng = seeded_rng(self.seed, "train", step)
        batch: list[Problem] = []
        while len(batch) < num_prompts:
            problem = self._draw(rng)
            if problem.prompt not in self._eval_prompts:
                batch.append(problem)
        return batch

    def eval_set(self) -> list[Problem]:
        return list(self._eval)

    def _num_operands(self) -> int:
        """Integers with between min_digits and max_digits digits (0 counts as one digit)."""
        low = 0 if self.min_digits == 1 else 10 ** (self.min_digits - 1)
        return 10**self.max_digits - low

    def _draw_eval(self) -> list[Problem]:
        """eval_size distinct problems, in the order first drawn from the eval stream."""
        rng = seeded_rng(self.seed, "eval")
        problems: dict[str, Problem] = {}
        while len(problems) < self.eval_size:
            problem = self._draw(rng)
            problems.setdefault(problem.prompt, problem)
        return list(problems.values())

    def _draw(self, rng: random.Random) -> Problem:
        op = self.operations[rng.randrange(len(self.operations))]
        a = rng.randrange(*rng.choice(self._operand_ranges))
        b = rng.randrange(*rng.choice(self._operand_ranges))
        return Problem(prompt=f"{a}{op}{b}=", answer=str(OPERATIONS[op](a, b)))


@dataclass
class ArithmeticTaskConfig(ReasoningTaskConfig):
    """`task=arithmetic`: problems generated from `data_seed`; difficulty by operand digits and operators."""

    name: str = "arithmetic"
    min_digits: int = 1
    """Fewest digits of an operand."""
    max_digits: int = 2
    """Most digits of an operand (digits are drawn uniformly in [min_digits, max_digits])."""
    operations: str = "+-"
    """The operators to draw from, a subset of `+-*`."""

    def prompt_source(self) -> ArithmeticTask:
        return ArithmeticTask(
            seed=self.data_seed,
            min_digits=self.min_digits,
            max_digits=self.max_digits,
            operations=self.operations,
            eval_size=self.eval_size,
        )
