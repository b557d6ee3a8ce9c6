"""`task=dataset`: your own problems from local JSONL, JSON or Parquet files, read with the `datasets` library.

Records map to problems through named keys: `task.prompt_key` (the question; `question` for GSM8K) or, for chat
records, `task.messages_key` (a list of `{"role", "content"}` turns ending with the user's), and `task.answer_key`
(the reference answer as written: a GSM8K answer keeps its worked solution and `#### 72` line, which the `gsm8k`
reward reads). A dotted key that is not a key of the record names a nested field: verl's preprocessed files keep the
chat turns under `prompt` and the answer under `reward_model.ground_truth`. Every other field of a record travels
with the problem (`Problem.extra`) to the reward function.

`task.train_path` and `task.eval_path` name one file, a glob pattern of files (a sharded dataset's
`train-*.parquet`), or a list of both (`task.train_path=[/data/gsm8k/train.parquet,/data/math/train.parquet]`, as
verl's `data.train_files`), read in order into one set of problems. JSON Lines files are read line by line, so that
an error names its line; JSON and Parquet files by `datasets`. The driver reads and checks the files before Ray starts
(`checks.check_reasoning` builds the prompt source): a file that is missing or unreadable, a line that is not a JSON
object, a record without a named key or with an empty value, and a held-out split larger than the data are refused
in one line naming the file, the line and the key. Workers read the files again through the same code. Batches are a
pure function of (seed, step), as for every task: each epoch walks the training problems in an order seeded by
(seed, epoch).
"""

from __future__ import annotations

import glob
import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlplace.core.errors import ConfigError, check, check_choice

from .prompts import TRUNCATIONS, Problem, check_batch_request, seeded_rng
from .registry import ReasoningTaskConfig

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""File suffix -> the `datasets` builder that reads it."""
ROLES = ("system", "user", "assistant")
DATA_FILES = "a JSONL, JSON or Parquet file, a glob pattern of them, or a list of files and patterns"
GLOB_CHARACTERS = "*?["


@dataclass
class DatasetTaskConfig(ReasoningTaskConfig):
    """`task=dataset`: problems read from your files (`DatasetTask`)."""

    name: str = "dataset"
    train_path: Any = None
    """The records to train on: a JSONL, JSON or Parquet file, a glob pattern of such files (a sharded dataset's
    `train-*.parquet`), or a list of files and patterns (verl's `data.train_files`), read in that order."""
    eval_path: Any = None
    """Held-out records, named as train_path's are; None holds out `eval_fraction` (or else `eval_size`) of the
    train_path records."""
    eval_fraction: float | None = None
    """With no eval_path: the share of train_path records held out (overrides eval_size)."""
    prompt_key: str = "prompt"
    """The record's question (`question` for GSM8K); a dotted key names a nested field, as answer_key's may."""
    answer_key: str = "answer"
    """The record's reference answer, passed as written to the reward (`reward_model.ground_truth` in verl's files:
    the field `ground_truth` of the record's `reward_model`)."""
    messages_key: str | None = None
    """Chat records: the key of the turns (`[{"role": ..., "content": ...}, ...]`, the last one the user's); the
    prompt key is then not read."""
    max_prompt_length: int | None = None
    """The most tokens a prompt may have, as the model is asked it (verl's `data.max_prompt_length`), below what the
    model's context leaves for rollout.max_new_tokens; null: that room alone."""
    truncation: str = "error"
    """A prompt longer than max_prompt_length (verl's `data.truncation`): `error` refuses the data before any worker
    starts, naming the longest; `left`, `right` or `middle` cut it to max_prompt_length tokens there
    (`prompts.truncate`), and the driver logs how many were cut."""
    filter_overlong_prompts: bool = False
    """Drop the records whose prompt, as the model is asked it, is longer than task.max_prompt_length or leaves no
    room for rollout.max_new_tokens in the model's context (verl's `data.filter_overlong_prompts`), and log how many;
    false refuses such data before any worker starts, naming the longest prompt."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.train_path is not None, "task.train_path", self.train_path, DATA_FILES)
        limit = self.max_prompt_length
        check(limit is None or limit >= 1, "task.max_prompt_length", limit, "null or at least 1")
        check_choice("task.truncation", self.truncation, TRUNCATIONS)
        check(
            self.truncation == "error" or limit is not None,
            "task.truncation",
            self.truncation,
            "error while task.max_prompt_length is null (set it to the tokens a prompt is cut to)",
        )
        for key, value in (("task.train_path", self.train_path), ("task.eval_path", self.eval_path)):
            if value is not None:
                entries = value if isinstance(value, list | tuple) else [value]
                check(bool(entries) and all(isinstance(e, str) and e for e in entries), key, value, DATA_FILES)
        if self.eval_fraction is not None:
            check(0 < self.eval_fraction < 1, "task.eval_fraction", self.eval_fraction, "in (0, 1), or null")

    def origin(self, split: str) -> tuple[str, object]:
        if split == "eval" and self.eval_path is not None:
            return "task.eval_path", self.eval_path
        return "task.train_path", self.train_path  # the held-out records too, without an eval_path

    def prompt_source(self) -> DatasetTask:
        assert self.train_path is not None, "DatasetTaskConfig refuses a missing train_path"
        return DatasetTask(self)


class DatasetTask:
    """Problems from `task.train_path` (and `task.eval_path`), a `PromptSource`."""

    def __init__(self, cfg: DatasetTaskConfig) -> None:
        self.seed = cfg.data_seed
        problems = read_problems(cfg.train_path, "task.train_path", cfg)
        if cfg.eval_path is None:
            key, size = "task.eval_size", cfg.eval_size
            if cfg.eval_fraction is not None:
                key, size = "task.eval_fraction", max(1, round(cfg.eval_fraction * len(problems)))
            check(
                size < len(problems),
                key,
                cfg.eval_fraction if cfg.eval_fraction is not None else size,
                f"at most {len(problems) - 1} held-out records: task.train_path = {cfg.train_path!r} holds "
                f"{len(problems)}, and at least one must remain for training",
            )
            held_out = sorted(seeded_rng(self.seed, "eval").sample(range(len(problems)), size))
            self._eval = [problems[i] for i in held_out]
        else:
            self._eval = read_problems(cfg.eval_path, "task.eval_path", cfg)
        eval_prompts = {p.prompt for p in self._eval}
        self._train = [p for p in problems if p.prompt not in eval_prompts]
        check(
            bool(self._train),
            "task.train_path",
            cfg.train_path,
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

    def keep_fitting(self, lengths: Callable[[list[Problem]], list[int]], room: int) -> tuple[int, int]:
        """Drop the problems whose prompt is longer than `room` tokens (`lengths` measures a list of prompts);
        returns how many were dropped from training and from the held-out set. ConfigError naming
        task.filter_overlong_prompts when a split would be left empty."""
        dropped = []
        for split, problems in (("train", self._train), ("eval", self._eval)):
            kept = [p for p, n in zip(problems, lengths(problems), strict=True) if n <= room]
            check(
                bool(kept),
                "task.filter_overlong_prompts",
                True,
                f"false, or room for longer prompts: every {split} prompt is longer than the {room} tokens that "
                "task.max_prompt_length and the model's context with rollout.max_new_tokens after them allow",
            )
            dropped.append(len(problems) - len(kept))
            problems[:] = kept
        self._order_epoch = -1  # the orders were of the records before
        return dropped[0], dropped[1]

    def _epoch_order(self, epoch: int) -> list[int]:
        """The permutation of training problems for `epoch`; the latest one is kept, as batches walk forward."""
        if epoch != self._order_epoch:
            order = list(range(len(self._train)))
            seeded_rng(self.seed, "epoch", epoch).shuffle(order)
            self._order_epoch, self._order = epoch, order
        return self._order


def read_problems(paths: str | list[str], key: str, cfg: DatasetTaskConfig) -> list[Problem]:
    """The problems of the files `paths` names (`data_files`), in order; ConfigError in one line naming `key`, the
    file, the line (JSONL) or record, and what is wrong."""
    problems = []
    for item_key, file in data_files(paths, key):
        if file.suffix == ".jsonl":
            numbered = [(f"{item_key}: {file}:{number}", record) for number, record in _json_lines(file, item_key)]
        else:
            records = _read_table(file, item_key)
            numbered = [(f"{item_key}: {file} record {i}", record) for i, record in enumerate(records, start=1)]
        if not numbered:
            raise ConfigError(f"{item_key} = {str(file)!r} is invalid: the file holds no records")
        problems += [_problem(record, where, cfg) for where, record in numbered]
    return problems


def data_files(paths: str | list[str], key: str) -> list[tuple[str, Path]]:
    """The files a train_path or eval_path value names, each with the key that names it in errors
    (`task.train_path[1]` for a list's second entry): a file as it is, a glob pattern's matches sorted by name.
    ConfigError naming the key and the entry for a missing file, a pattern nothing matches, a folder (its files must
    be named: it may hold other splits) and a suffix that is not a data format's."""
    entries = [(key, paths)] if isinstance(paths, str) else [(f"{key}[{i}]", p) for i, p in enumerate(paths)]
    files = []
    for item_key, entry in entries:
        path = Path(entry).expanduser()
        if any(c in entry for c in GLOB_CHARACTERS):
            matched = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
            if not matched:
                raise ConfigError(f"{item_key} = {entry!r} is invalid: no file matches it")
        elif path.is_dir():
            raise ConfigError(
                f"{item_key} = {entry!r} is invalid: a folder; name its files, e.g. {str(path / '*.parquet')!r}"
            )
        elif not path.is_file():
            raise ConfigError(f"{item_key} = {entry!r} is invalid: no such file")
        else:
            matched = [path]
        for file in matched:
            if file.suffix not in FORMATS:
                matches = "" if file == path else f"it matches {file.name}, but "
                raise ConfigError(
                    f"{item_key} = {entry!r} is invalid: {matches}the suffix must be one of {', '.join(FORMATS)}"
                )
            files.append((item_key, file))
    return files


def _read_table(file: Path, key: str) -> list[dict[str, Any]]:
    """The records of a JSON (an array of objects, or objects one per line) or Parquet file, read by `datasets` into
    memory; its cache goes into a temporary folder removed at once, so nothing is left under ~/.cache."""
    import datasets  # deferred: a second to import, and only runs of a dataset task need it

    datasets.disable_progress_bars()
    builder = FORMATS[file.suffix]
    with tempfile.TemporaryDirectory(prefix="rlplace-datasets-") as cache:
        try:
            table = datasets.load_dataset(builder, data_files=str(file), split="train", cache_dir=cache)
        except Exception as err:  # datasets raises several kinds for a malformed file
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"{key}: {file}: not a readable {builder} file ({first})") from err
        return table.to_list()


def _json_lines(file: Path, key: str) -> list[tuple[int, dict[str, Any]]]:
    """The records of a JSON Lines file with their line numbers, read line by line (not by `datasets`, which names
    no line and coerces each key's values to one type across lines); blank lines are skipped."""
    records = []
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
                raise ConfigError(f"{where}: expected a JSON object, got {line.strip()[:80]!r}")
            records.append((number, record))
    return records


def _problem(record: Mapping[str, Any], where: str, cfg: DatasetTaskConfig) -> Problem:
    answer = _answer(_field(record, cfg.answer_key, "task.answer_key", where), cfg.answer_key, where)
    if cfg.messages_key is not None:
        messages = _messages(_field(record, cfg.messages_key, "task.messages_key", where), cfg.messages_key, where)
        prompt, used = messages[-1]["content"], cfg.messages_key
    else:
        prompt = _text(_field(record, cfg.prompt_key, "task.prompt_key", where), cfg.prompt_key, where)
        used, messages = cfg.prompt_key, ()
    extra = {k: v for k, v in record.items() if k not in (used, cfg.answer_key)}
    return Problem(prompt=prompt, answer=answer, extra=extra, messages=messages)


def _field(record: Mapping[str, Any], name: str, key: str, where: str) -> Any:
    """`record[name]`; for a dotted name that is not a key of the record, the nested field it names."""
    path = [name] if name in record else name.split(".")
    holder: Mapping[str, Any] = record
    for depth, part in enumerate(path):
        value = holder.get(part)
        if value is None:
            present = sorted(k for k, v in holder.items() if v is not None)
            within = f'"{".".join(path[:depth])}"' if depth else "record"
            raise ConfigError(f'{where}: no "{name}" ({key}); the {within} has: {", ".join(present) or "nothing"}')
        if depth + 1 < len(path) and not isinstance(value, Mapping):
            prefix = ".".join(path[: depth + 1])
            raise ConfigError(f'{where}: no "{name}" ({key}): "{prefix}" is a {type(value).__name__}, not a record')
        holder = value
    return value


def _text(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'{where}: "{name}" must be a non-empty string, got {value!r:.80}')
    return value


def _answer(value: Any, name: str, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f'{where}: "{name}" must be a string or a number, got {value!r:.80}')
    answer = str(value).strip()
    if not answer:
        raise ConfigError(f'{where}: "{name}" is empty')
    return answer


def _messages(value: Any, name: str, where: str) -> tuple[dict[str, str], ...]:
    valid = (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in value)
    )
    if not valid or value[-1]["role"] != "user":
        raise ConfigError(
            f'{where}: "{name}" must be a list of {{"role": {"|".join(ROLES)}, "content": text}} turns ending with '
            f"the user's, got {value!r:.80}"
        )
    return tuple({"role": m["role"], "content": m["content"]} for m in value)
