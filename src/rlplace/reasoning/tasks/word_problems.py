"""Synthetic grade-school word problems in GSM8K's format, written by the project so its example downloads nothing.

Each record is `{"question": ..., "answer": ...}` where the answer is a short worked solution whose last line is
`#### <number>`, as in GSM8K: the example (`experiment=gsm8k_grpo`) reads them with `task=dataset`
(`task.prompt_key=question`) and scores with the `gsm8k` reward, exactly as a user's own GSM8K file would be read.
The problems are one- or two-step stories over a few templates (buying, sharing, giving away, rows of things), small
enough for a tiny model to learn the pattern. `write` regenerates the shipped files; they are a pure function of
the seed, and a test checks that the shipped files are what `write` makes.

    python -m rlplace.reasoning.tasks.word_problems    # rewrites rlplace/data/word_problems/{train,test}.jsonl
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "word_problems"
"""Where the shipped files live (package data, so a wheel has them too)."""
SPLITS = {"train": 400, "test": 100}
"""Records per file."""
SEED = 0

NAMES = ("Ava", "Ben", "Chloe", "Dan", "Eva", "Finn", "Grace", "Hugo", "Isla", "Jack", "Lena", "Omar", "Rosa", "Sam")
THINGS = ("apples", "stickers", "marbles", "books", "pencils", "cookies", "shells", "cards")

Template = Callable[[random.Random], tuple[str, str, int]]
"""A random stream -> (question, worked solution without its answer line, answer)."""


def _buys(rng: random.Random) -> tuple[str, str, int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    have, more = rng.randint(2, 40), rng.randint(2, 30)
    total = have + more
    question = f"{name} has {have} {thing}. {name} gets {more} more. How many {thing} does {name} have now?"
    return question, f"{name} has {have} + {more} = {total} {thing}.", total


def _gives_away(rng: random.Random) -> tuple[str, str, int]:
    name, friend, thing = *rng.sample(NAMES, 2), rng.choice(THINGS)
    have = rng.randint(10, 60)
    gives = rng.randint(1, have - 1)
    left = have - gives
    question = f"{name} has {have} {thing} and gives {gives} to {friend}. How many {thing} does {name} have left?"
    return question, f"{name} has {have} - {gives} = {left} {thing} left.", left


def _rows(rng: random.Random) -> tuple[str, str, int]:
    thing = rng.choice(THINGS)
    rows, per_row = rng.randint(2, 9), rng.randint(2, 12)
    total = rows * per_row
    question = f"There are {rows} boxes with {per_row} {thing} in each box. How many {thing} are there in all?"
    return question, f"There are {rows} * {per_row} = {total} {thing}.", total


def _shares(rng: random.Random) -> tuple[str, str, int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    friends, each = rng.randint(2, 6), rng.randint(2, 10)
    total = friends * each
    question = f"{name} shares {total} {thing} equally among {friends} friends. How many {thing} does each friend get?"
    return question, f"Each friend gets {total} / {friends} = {each} {thing}.", each


def _buys_then_gives(rng: random.Random) -> tuple[str, str, int]:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    have, more = rng.randint(5, 30), rng.randint(2, 20)
    gives = rng.randint(1, have + more - 1)
    mid, left = have + more, have + more - gives
    question = (
        f"{name} has {have} {thing}, buys {more} more and then gives away {gives}. How many {thing} does {name} "
        "have now?"
    )
    solution = f"After buying, {name} has {have} + {more} = {mid} {thing}.\nThen {mid} - {gives} = {left}."
    return question, solution, left


TEMPLATES: tuple[Template, ...] = (_buys, _gives_away, _rows, _shares, _buys_then_gives)


def records(count: int, seed: int) -> list[dict[str, str]]:
    """`count` distinct problems drawn from the templates in turn by a stream seeded with `seed`."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        question, solution, answer = TEMPLATES[len(out) % len(TEMPLATES)](rng)
        if question not in seen:
            seen.add(question)
            out.append({"question": question, "answer": f"{solution}\n#### {answer}"})
    return out


def write(folder: Path = DATA_DIR, seed: int = SEED) -> dict[str, Path]:
    """Write the splits as JSON Lines into `folder`; a test prompt never appears in the training file."""
    folder.mkdir(parents=True, exist_ok=True)
    drawn = records(sum(SPLITS.values()), seed)
    paths, first = {}, 0
    for split, count in SPLITS.items():
        paths[split] = folder / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in drawn[first : first + count]))
        first += count
    return paths


if __name__ == "__main__":
    for path in write().values():
        print(path)
