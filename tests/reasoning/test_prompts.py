"""exact_match() and task=dataset: exact-match rewards, reading records, held-out splits, epochs, clear errors."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from rlplace.core.errors import ConfigError
from rlplace.reasoning.rewards import exact_match
from rlplace.reasoning.tasks.arithmetic import ArithmeticTaskConfig
from rlplace.reasoning.tasks.dataset import DatasetTask, DatasetTaskConfig, data_files
from rlplace.reasoning.tasks.prompts import Problem, PromptSource


@pytest.mark.parametrize(
    ("response", "answer", "reward"),
    [
        ("82", "82", 1.0),
        ("  82 \t", "82", 1.0),
        ("82\n37+1=38", "82", 1.0),  # the answer ends at the first newline
        ("\n82", "82", 0.0),  # an empty first line is an empty answer
        ("83", "82", 0.0),
        ("82 37", "82", 0.0),  # extra text on the answer's line
        ("082", "82", 0.0),
        ("", "82", 0.0),
        ("   \n", "82", 0.0),
        ("-7", "-7", 1.0),
        (" -7\n", "-7", 1.0),
        ("7", "-7", 0.0),
        ("-7", "7", 0.0),
        ("- 7", "-7", 0.0),
    ],
)
def test_exact_match_is_exact_match_on_the_first_line(response: str, answer: str, reward: float) -> None:
    assert exact_match("37+45=", response, answer, {}) == reward


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def dataset_task(
    train: str | list[str], evals: str | list[str] | None, seed: int, eval_size: int = 200, **keys: object
) -> DatasetTask:
    return DatasetTaskConfig(
        train_path=train, eval_path=evals, data_seed=seed, eval_size=eval_size, **keys
    ).prompt_source()


def _records(n: int, start: int = 0) -> list[str]:
    return [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(start, start + n)]


def test_reads_problems_with_numeric_answers_and_skips_blank_lines(tmp_path: Path) -> None:
    train = _write(
        tmp_path / "train.jsonl",
        [
            '{"prompt": "2+3=", "answer": 5}',
            "",
            '{"prompt": "half of 5?", "answer": 2.5, "source": "extra keys go to the reward"}',
            '{"prompt": "capital of France?", "answer": " Paris "}',
            "   ",
        ],
    )
    evals = _write(tmp_path / "eval.jsonl", ['{"prompt": "1-8=", "answer": -7}'])
    task = dataset_task(train, evals, seed=0)
    assert isinstance(task, PromptSource)
    assert task.eval_set() == [Problem("1-8=", "-7")]
    assert sorted(task.train_batch(0, 3), key=lambda p: p.prompt) == [
        Problem("2+3=", "5"),
        Problem("capital of France?", "Paris"),
        Problem("half of 5?", "2.5", {"source": "extra keys go to the reward"}),
    ]


def test_an_eval_file_is_the_whole_eval_set_and_its_prompts_leave_training(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(10))
    evals = _write(tmp_path / "eval.jsonl", _records(3, start=8) + _records(1, start=50))
    task = dataset_task(train, evals, seed=0, eval_size=1)  # eval_size only applies without an eval file
    assert [p.prompt for p in task.eval_set()] == ["8+1=", "9+1=", "10+1=", "50+1="]
    assert task.num_train == 8
    assert {p.prompt for p in task.train_batch(0, 8)} == {f"{i}+1=" for i in range(8)}


def test_without_an_eval_file_seeded_lines_are_held_out(tmp_path: Path) -> None:
    lines = _records(40)
    train = _write(tmp_path / "train.jsonl", lines)
    task = dataset_task(train, None, seed=1, eval_size=10)
    held = task.eval_set()
    everything = [Problem(f"{i}+1=", str(i + 1)) for i in range(40)]
    assert len(held) == 10
    assert held == [p for p in everything if p in held]  # a subset, kept in file order
    assert held == dataset_task(train, None, seed=1, eval_size=10).eval_set()
    assert held != dataset_task(train, None, seed=2, eval_size=10).eval_set()
    trained = task.train_batch(0, task.num_train)
    assert sorted(trained + held, key=lambda p: int(p.answer)) == everything


def test_duplicate_prompts_never_leak_from_eval_into_training(tmp_path: Path) -> None:
    same = json.dumps({"prompt": "same", "answer": "x"})
    train = _write(tmp_path / "train.jsonl", [same] * 30 + _records(30))
    task = dataset_task(train, None, seed=0, eval_size=20)
    eval_prompts = {p.prompt for p in task.eval_set()}
    assert "same" in eval_prompts
    assert task.num_train == 30 - len(eval_prompts - {"same"})
    assert all(p.prompt not in eval_prompts for step in range(50) for p in task.train_batch(step, 7))


def test_each_epoch_draws_every_training_problem_once(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(10))
    task = dataset_task(train, _write(tmp_path / "eval.jsonl", _records(1, start=99)), seed=3)
    drawn = [p.prompt for step in range(20) for p in task.train_batch(step, 3)]  # 60 draws: 6 epochs of 10
    epochs = [drawn[i : i + 10] for i in range(0, 60, 10)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(f"{i}+1=" for i in range(10))
    assert len({tuple(epoch) for epoch in epochs}) > 1  # each epoch has its own order


def test_batches_are_deterministic_and_independent_of_earlier_calls(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(25))
    used, fresh = dataset_task(train, None, seed=5, eval_size=5), dataset_task(train, None, seed=5, eval_size=5)
    for step in (30, 0, 7):
        used.train_batch(step, 6)
    assert used.train_batch(4, 6) == fresh.train_batch(4, 6)
    assert fresh.train_batch(4, 6) != fresh.train_batch(5, 6)
    assert fresh.train_batch(0, 20) != dataset_task(train, None, seed=6, eval_size=5).train_batch(0, 20)
    big = fresh.train_batch(1, 45)  # one batch spanning three epochs of 20 keeps the per-epoch order
    assert big == [p for step in range(9, 18) for p in fresh.train_batch(step, 5)]


def test_missing_files_are_refused_naming_the_key_and_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match=re.escape(f"task.train_path = {missing!r} is invalid: no such file")):
        dataset_task(missing, None, seed=0)
    train = _write(tmp_path / "train.jsonl", _records(3))
    with pytest.raises(ValueError, match=re.escape(f"task.eval_path = {missing!r} is invalid: no such file")):
        dataset_task(train, missing, seed=0)


def test_a_glob_pattern_and_a_list_of_files_read_in_order(tmp_path: Path) -> None:
    for shard in range(3):  # written out of order: a pattern's matches are read sorted by name
        _write(tmp_path / f"train-{2 - shard}.jsonl", _records(2, start=10 * (2 - shard)))
    evals = _write(tmp_path / "test.jsonl", _records(2, start=100))
    task = dataset_task(str(tmp_path / "train-*.jsonl"), evals, seed=0)
    assert sorted(p.prompt for p in task.train_batch(0, 6)) == sorted(f"{i}+1=" for i in (0, 1, 10, 11, 20, 21))
    paths = [str(tmp_path / "train-2.jsonl"), str(tmp_path / "train-[01].jsonl")]
    assert [p.prompt for p in dataset_task(paths, [evals, evals], seed=0).eval_set()] == ["100+1=", "101+1="] * 2
    config = DatasetTaskConfig(train_path=paths, eval_path=evals)
    assert [str(file) for _, file in data_files(config.train_path, "task.train_path")] == [
        str(tmp_path / f"train-{shard}.jsonl") for shard in (2, 0, 1)
    ]


def test_patterns_folders_and_entries_that_name_no_file_are_refused(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(3))
    pattern = str(tmp_path / "shard-*.parquet")
    with pytest.raises(ConfigError, match=re.escape(f"task.train_path[1] = {pattern!r} is invalid: no file matches")):
        dataset_task([train, pattern], None, seed=0, eval_size=1)
    with pytest.raises(ConfigError, match=re.escape(f"task.eval_path = {str(tmp_path)!r} is invalid: a folder; name")):
        dataset_task(train, str(tmp_path), seed=0)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match=r"it matches notes.txt, but the suffix must be one of .jsonl"):
        dataset_task(str(tmp_path / "*"), None, seed=0, eval_size=1)
    for bad in ([], [train, 3], ""):
        with pytest.raises(ConfigError, match=r"task.train_path = .* is invalid: a JSONL, JSON or Parquet file"):
            DatasetTaskConfig(train_path=bad)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"prompt": "1+1=", "answer": ', "not valid JSON"),
        ('{"answer": "2"}', 'no "prompt" (task.prompt_key)'),
        ('{"prompt": "1+1="}', 'no "answer" (task.answer_key)'),
        ('["1+1=", "2"]', "expected a JSON object"),
        ('{"prompt": "", "answer": "2"}', '"prompt" must be a non-empty string'),
        ('{"prompt": 11, "answer": "2"}', '"prompt" must be a non-empty string'),
        ('{"prompt": "1+1=", "answer": true}', '"answer" must be a string or a number'),
        ('{"prompt": "1+1=", "answer": null}', 'no "answer" (task.answer_key)'),
        ('{"prompt": "1+1=", "answer": "  "}', '"answer" is empty'),
    ],
)
def test_a_malformed_line_is_refused_naming_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    path = tmp_path / "train.jsonl"
    _write(path, [*_records(2), "", bad_line, *_records(1)])
    with pytest.raises(ValueError, match=re.escape(f"task.train_path: {path}:4: {message}")):
        dataset_task(str(path), None, seed=0, eval_size=1)


def test_a_line_that_is_not_utf8_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "eval.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "b"}\n\xff\xfe\n')
    train = _write(tmp_path / "train.jsonl", _records(3))
    with pytest.raises(ValueError, match=re.escape(f"task.eval_path: {path}:2: not UTF-8 text")):
        dataset_task(train, str(path), seed=0)


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_file_is_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(content)
    with pytest.raises(
        ValueError, match=re.escape(f"task.train_path = {str(path)!r} is invalid: the file holds no records")
    ):
        dataset_task(str(path), None, seed=0)


@pytest.mark.parametrize("eval_size", [5, 6])
def test_a_held_out_split_must_leave_training_lines(tmp_path: Path, eval_size: int) -> None:
    train = _write(tmp_path / "train.jsonl", _records(5))
    with pytest.raises(ValueError, match=re.escape(f"task.eval_size = {eval_size} is invalid: at most 4 held-out")):
        dataset_task(train, None, seed=0, eval_size=eval_size)


def test_nothing_left_to_train_on_is_refused(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(4))
    with pytest.raises(ValueError, match="task.train_path = .* is invalid: every prompt in it is also in the eval set"):
        dataset_task(train, train, seed=0)


def test_negative_step_is_refused(tmp_path: Path) -> None:
    task = dataset_task(_write(tmp_path / "train.jsonl", _records(4)), None, seed=0, eval_size=1)
    with pytest.raises(ValueError, match="step = -3 is invalid"):
        task.train_batch(-3, 2)


GSM8K = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
    "many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
}
CHAT = {
    "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+3?"}],
    "answer": "5",
    "level": 1,
}
VERL = {  # a record of verl's preprocessed GSM8K files: the turns under "prompt", the answer nested
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": 'What is 48+24? Output the final answer after "####".'}],
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 0},
}


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_gsm8k_and_chat_records_load_with_their_keys(tmp_path: Path, suffix: str) -> None:
    import datasets

    def write(name: str, records: list[dict]) -> str:
        path = tmp_path / f"{name}{suffix}"
        if suffix == ".parquet":
            datasets.Dataset.from_list(records).to_parquet(str(path))
        elif suffix == ".json":
            path.write_text(json.dumps(records))
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return str(path)

    gsm8k = [GSM8K, {**GSM8K, "question": "Another question?"}]
    task = dataset_task(write("gsm8k", gsm8k), None, seed=0, eval_size=1, prompt_key="question")
    (problem,) = [p for p in task.eval_set() + task.train_batch(0, 1) if p.prompt == GSM8K["question"]]
    assert problem.answer == GSM8K["answer"] and problem.answer.endswith("#### 72") and problem.extra == {}
    chats = [CHAT, {**CHAT, "messages": [{"role": "user", "content": "What is 1+1?"}], "answer": "2"}]
    task = dataset_task(write("chat", chats), None, seed=0, eval_size=1, messages_key="messages")
    problems = {p.prompt: p for p in task.eval_set() + task.train_batch(0, 1)}
    assert problems["What is 2+3?"].messages == tuple(CHAT["messages"]) and problems["What is 2+3?"].answer == "5"
    assert problems["What is 2+3?"].extra == {"level": 1}
    verl = [VERL, {**VERL, "prompt": [{"role": "user", "content": "What is 1+1?"}]}]
    keys = {"messages_key": "prompt", "answer_key": "reward_model.ground_truth"}
    task = dataset_task(write("verl", verl), None, seed=0, eval_size=1, **keys)
    (problem,) = [p for p in task.eval_set() + task.train_batch(0, 1) if p.messages == tuple(VERL["prompt"])]
    assert problem.answer == "72" and set(problem.extra) == {"data_source", "reward_model", "extra_info"}


def test_a_record_without_the_named_key_is_refused_naming_it(tmp_path: Path) -> None:
    path = _write(tmp_path / "gsm8k.jsonl", [json.dumps(GSM8K)] * 3)
    with pytest.raises(
        ValueError,
        match=re.escape(f'task.train_path: {path}:1: no "prompt" (task.prompt_key); the record has: answer, question'),
    ):
        dataset_task(path, None, seed=0, eval_size=1)
    chat = _write(tmp_path / "chat.jsonl", [json.dumps({**CHAT, "messages": [{"role": "assistant", "content": "5"}]})])
    with pytest.raises(ValueError, match=re.escape(f'task.train_path: {chat}:1: "messages" must be a list of')):
        dataset_task(chat, None, seed=0, eval_size=1, messages_key="messages")
    verl = _write(tmp_path / "verl.jsonl", [json.dumps(VERL)] * 3)
    for answer_key, why in [
        ("reward_model.truth", '; the "reward_model" has: ground_truth, style'),
        ("data_source.truth", ': "data_source" is a str, not a record'),
        ("solution.truth", "; the record has: data_source, extra_info, prompt, reward_model"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f'{verl}:1: no "{answer_key}" (task.answer_key){why}')):
            dataset_task(verl, None, seed=0, eval_size=1, messages_key="prompt", answer_key=answer_key)


def test_eval_fraction_holds_out_a_share_and_is_refused_when_it_leaves_nothing(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", _records(10))
    assert len(dataset_task(train, None, seed=0, eval_fraction=0.3).eval_set()) == 3
    with pytest.raises(ValueError, match=re.escape("task.eval_fraction = 0.99 is invalid: at most 9 held-out")):
        dataset_task(train, None, seed=0, eval_fraction=0.99)


def test_prompts_render_with_the_chat_template_when_the_tokenizer_has_one() -> None:
    from rlplace.reasoning.models.tiny_qwen2 import train_tokenizer
    from rlplace.reasoning.tasks.prompts import encode_prompts

    tokenizer = train_tokenizer(["What is 2+3? Answer briefly. 5"] * 4, vocab_size=300)
    plain, chat = Problem("What is 2+3?", "5"), Problem("What is 2+3?", "5", messages=tuple(CHAT["messages"]))
    arithmetic = ArithmeticTaskConfig()
    expected = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    (ids,) = encode_prompts(tokenizer, [plain], arithmetic)
    assert tokenizer.decode(ids) == expected
    (ids,) = encode_prompts(tokenizer, [chat], arithmetic)
    assert tokenizer.decode(ids) == "<|im_start|>system\nAnswer briefly.<|im_end|>\n" + expected
    arithmetic.system_prompt = "Answer briefly."
    assert encode_prompts(tokenizer, [plain], arithmetic) == encode_prompts(tokenizer, [chat], arithmetic)
    arithmetic.apply_chat_template = False
    (ids,) = encode_prompts(tokenizer, [plain], arithmetic)
    assert tokenizer.decode(ids) == "Answer briefly.\nWhat is 2+3?"
    tokenizer.chat_template = None
    arithmetic.apply_chat_template = True
    with pytest.raises(
        ValueError, match="task.apply_chat_template = true is invalid: the model's tokenizer has no chat"
    ):
        encode_prompts(tokenizer, [plain], arithmetic)


QWEN3_STYLE = (  # ChatML with Qwen3's switch: enable_thinking=false opens and closes an empty thinking block
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def test_chat_template_kwargs_reach_the_template_and_a_name_it_never_reads_is_refused() -> None:
    from rlplace.reasoning.models.tiny_qwen2 import train_tokenizer
    from rlplace.reasoning.tasks.prompts import encode_prompts

    tokenizer = train_tokenizer(["What is 2+3? <think> </think> 5"] * 4, vocab_size=300)
    tokenizer.chat_template = QWEN3_STYLE
    plain = Problem("What is 2+3?", "5")
    task = ArithmeticTaskConfig(chat_template_kwargs={"enable_thinking": False})
    (ids,) = encode_prompts(tokenizer, [plain], task)
    asked = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(ids) == asked + "<think>\n\n</think>\n\n"
    task.chat_template_kwargs = {}
    (ids,) = encode_prompts(tokenizer, [plain], task)
    assert tokenizer.decode(ids) == asked
    task.chat_template_kwargs = {"enable_thinkng": False}
    with pytest.raises(
        ConfigError,
        match=r"^task.chat_template_kwargs.enable_thinkng = False is invalid: the model's "
        r"chat template never reads enable_thinkng \(it reads: add_generation_prompt, enable_thinking, "
        r"messages\)$",
    ):
        encode_prompts(tokenizer, [plain], task)
    task.chat_template_kwargs, task.apply_chat_template = {"enable_thinking": False}, False
    with pytest.raises(ConfigError, match=r"task.chat_template_kwargs = \{'enable_thinking': False\} is invalid: the"):
        encode_prompts(tokenizer, [plain], task)


def test_a_prompt_template_frames_the_users_turn_and_leaves_the_record_alone() -> None:
    """R1-Zero style: a base model asked through a template, raw or inside the chat template; braces of the
    template's own text (a `\\boxed{}` instruction) stay as they are."""
    from rlplace.reasoning.models.tiny_qwen2 import train_tokenizer
    from rlplace.reasoning.tasks.prompts import encode_prompts

    tokenizer = train_tokenizer(["User: What is 2+3? Put it in \\boxed{}. Assistant: <think> 5"] * 4, vocab_size=300)
    template = "User: {prompt} Put it in \\boxed{}. Assistant: <think>"
    plain = Problem("What is 2+3?", "5")
    task = ArithmeticTaskConfig(prompt_template=template, apply_chat_template=False)
    (ids,) = encode_prompts(tokenizer, [plain], task)
    assert tokenizer.decode(ids) == "User: What is 2+3? Put it in \\boxed{}. Assistant: <think>"
    task.apply_chat_template = None  # the chat template renders the templated turn
    chat = Problem("What is 2+3?", "5", messages=tuple(CHAT["messages"]))
    (ids,) = encode_prompts(tokenizer, [chat], task)
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nUser: What is 2+3? Put it in \\boxed{}. "
        "Assistant: <think><|im_end|>\n<|im_start|>assistant\n"
    )
    assert plain.prompt == "What is 2+3?" and chat.messages[-1]["content"] == "What is 2+3?"
    with pytest.raises(ConfigError, match=r"task.prompt_template = 'Q: A:' is invalid: null, or a text holding"):
        ArithmeticTaskConfig(prompt_template="Q: A:")


def test_prompts_too_long_for_the_model_are_refused_before_any_worker_starts(tmp_path: Path, model_path: Path) -> None:
    """The tiny LM's context is 128 tokens: a 121-token prompt leaves room for 7 new ones, a 129-token one for none;
    the error names what to change."""
    from rlplace.cli import compose_run
    from rlplace.families import resolve
    from rlplace.reasoning.launch import check_prompts_fit

    def prompt(tokens: int) -> str:  # a prompt of `tokens` tokens: one per character, and <bos>
        return json.dumps({"prompt": "1+" * ((tokens - 3) // 2) + "1=", "answer": "1"})

    def check(train: list[str], *overrides: str) -> None:
        path = _write(tmp_path / "train.jsonl", train)
        data = ["experiment=arithmetic_grpo", "task=dataset", f"task.train_path={path}", f"model.path={model_path}"]
        plan = resolve(compose_run([*data, "task.eval_size=2", "task.data_seed=1", *overrides]))
        check_prompts_fit(plan.cfg, model_path)

    check([*_records(6), prompt(121)], "rollout.max_new_tokens=7")  # 121 + 7 = 128 fits
    with pytest.raises(
        ConfigError,
        match=re.escape(f"""rollout.max_new_tokens = 8 is invalid with model.path = \
'{model_path}': its context of 128 tokens leaves room for 7 after the longest train prompt (121 tokens, '1+1+1+1+1+1\
+1+1+1+1+1+1+1+1+1+1+1+1+1+1+') (valid: 1 to 7, or shorter prompts)"""),
    ):
        check([*_records(6), prompt(121)])  # the long record in training (data_seed 1 holds out two others)
    with pytest.raises(
        ConfigError,
        match=re.escape(f"""task.train_path = '{tmp_path / "train.jsonl"}' is invalid \
with model.path = '{model_path}': 2 of its 5 train prompts do not fit the model's context of 128 tokens with \
rollout.max_new_tokens = 8 after them; the longest has 129 tokens"""),
    ):
        check([*_records(5), prompt(121), prompt(129)])
    evals = _write(tmp_path / "eval.jsonl", [prompt(129), *_records(2)])
    with pytest.raises(ConfigError, match=re.escape(f"task.eval_path = '{evals}' is invalid with model.path")):
        check(_records(6), f"task.eval_path={evals}")
    # verl's max_prompt_length: a budget below the context's room, which refuses what is longer (no truncation).
    check([*_records(6), prompt(121)], "rollout.max_new_tokens=7", "task.max_prompt_length=121")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"task.max_prompt_length = 100 is invalid with task.train_path = '{tmp_path / 'train.jsonl'}': 1 of its 5 "
            "train prompts is longer; the longest has 121 tokens ('1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+') (valid: "
            "121 or more, task.filter_overlong_prompts=true to leave them out, or task.truncation=left|right|middle "
            "to cut them)"
        ),
    ):
        check([*_records(6), prompt(121)], "rollout.max_new_tokens=7", "task.max_prompt_length=100")
    with pytest.raises(ConfigError, match=r"task.max_prompt_length = 0 is invalid: null or at least 1"):
        check(_records(6), "task.max_prompt_length=0")


def test_overlong_prompts_are_left_out_when_the_task_filters_them(
    tmp_path: Path, model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's filter_overlong_prompts: the records the previous test refuses are dropped instead, and counted; a split
    left empty is refused."""
    from rlplace.cli import compose_run
    from rlplace.families import resolve
    from rlplace.reasoning.launch import check_prompts_fit
    from rlplace.reasoning.models.tokenizer import load_tokenizer
    from rlplace.reasoning.tasks import drop_overlong, make_prompt_source

    def prompt(tokens: int) -> str:  # as in the test above
        return json.dumps({"prompt": "1+" * ((tokens - 3) // 2) + "1=", "answer": "1"})

    train = _write(tmp_path / "train.jsonl", [*_records(5), prompt(121), prompt(129)])
    data = ["experiment=arithmetic_grpo", "task=dataset", f"task.train_path={train}", f"model.path={model_path}"]
    data += ["task.eval_size=2", "task.data_seed=1", "task.filter_overlong_prompts=true"]  # 8 new tokens: 120 fit
    plan = resolve(compose_run(data))
    with caplog.at_level(logging.INFO):
        kept = check_prompts_fit(plan.cfg, model_path)  # the problems the run draws, which its memory is checked on
    assert (
        "task.filter_overlong_prompts: 2 training and 0 held-out prompts are longer than the 120 tokens" in caplog.text
    )
    assert kept.num_train == 3
    source = make_prompt_source(plan.cfg.task)
    assert drop_overlong(source, plan.cfg.task, load_tokenizer(model_path), 128, 8) == (2, 0)
    assert source.num_train == 3 and all(len(p.prompt) < 20 for p in source.train_batch(0, 6))
    # With 4 new tokens the context leaves room for the 121-token prompt; task.max_prompt_length does not.
    for limit, dropped in ((None, 1), (100, 2)):
        source = make_prompt_source(plan.cfg.task)
        task = replace(plan.cfg.task, max_prompt_length=limit)
        assert drop_overlong(source, task, load_tokenizer(model_path), 128, 4) == (dropped, 0)
    evals = _write(tmp_path / "eval.jsonl", [prompt(129)])
    plan = resolve(compose_run([*data, f"task.eval_path={evals}"]))
    with pytest.raises(ConfigError, match="task.filter_overlong_prompts = True is invalid: false, or room for longer"):
        check_prompts_fit(plan.cfg, model_path)


def test_truncate_keeps_what_verl_keeps() -> None:
    from rlplace.reasoning.tasks.prompts import truncate

    ids = list(range(10))
    assert truncate(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate(ids, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate(ids, 10, "left") == ids


def test_overlong_prompts_are_cut_when_the_task_truncates_them(
    tmp_path: Path, model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's data.truncation: the prompt the tests above refuse or drop is cut to task.max_prompt_length, the same
    in every process that encodes it, and counted; a pretrained model's cache key changes only when prompts are cut."""
    from rlplace.cli import compose_run
    from rlplace.families import resolve
    from rlplace.reasoning.launch import check_prompts_fit
    from rlplace.reasoning.models.tokenizer import load_tokenizer
    from rlplace.reasoning.pretrain import cache_config
    from rlplace.reasoning.tasks import count_truncated
    from rlplace.reasoning.tasks.prompts import encode_prompts, render_prompts

    long = "1+" * 59 + "1="  # 121 tokens with <bos>
    train = _write(tmp_path / "train.jsonl", [*_records(6), json.dumps({"prompt": long, "answer": "60"})])
    data = ["experiment=arithmetic_grpo", "task=dataset", f"task.train_path={train}", f"model.path={model_path}"]
    data += ["task.eval_size=2", "task.data_seed=1", "task.max_prompt_length=100"]
    tokenizer = load_tokenizer(model_path)
    problem = Problem(long, "60")
    (whole,) = render_prompts(tokenizer, [problem], DatasetTaskConfig(train_path=train))
    plan = resolve(compose_run([*data, "task.truncation=left"]))
    with caplog.at_level(logging.INFO):
        source = check_prompts_fit(plan.cfg, model_path)
    assert (
        "task.truncation = left: 1 training and 0 held-out prompts are longer than task.max_prompt_length = 100 tokens "
        "and are cut to it" in caplog.text
    )
    assert source.num_train == 5  # none left out
    assert count_truncated(source, plan.cfg.task, tokenizer) == (1, 0)  # the count with filter_overlong_prompts
    assert cache_config(plan.cfg)["task"]["truncation"] == "left"
    for side, kept in (("left", whole[-100:]), ("right", whole[:100]), ("middle", whole[:50] + whole[-50:])):
        assert encode_prompts(tokenizer, [problem], replace(plan.cfg.task, truncation=side)) == [kept]
    assert "truncation" not in cache_config(resolve(compose_run(data)).cfg)["task"]  # keys made before it stay valid
    with pytest.raises(ConfigError, match=r"task.truncation = 'left' is invalid: error while task.max_prompt_length"):
        DatasetTaskConfig(train_path=train, truncation="left")
    with pytest.raises(ConfigError, match=r"task.truncation = 'start' is invalid: valid: error, left, right, middle"):
        DatasetTaskConfig(train_path=train, truncation="start", max_prompt_length=100)


def test_a_tool_call_end_the_tokenizer_splits_is_refused_before_any_worker_starts(tmp_path: Path, model_path: Path):
    """The engines stop at rollout.multi_turn.call_end: one token of the vocabulary (the tiny LM's are characters)."""
    from rlplace.cli import compose_run
    from rlplace.families import resolve
    from rlplace.reasoning.launch import check_prompts_fit

    data = ["experiment=arithmetic_grpo", f"model.path={model_path}", "rollout.multi_turn.tool=calculator"]
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.call_end = '</tool_call>' is invalid: the model's"):
        check_prompts_fit(resolve(compose_run(data)).cfg, model_path)
    check_prompts_fit(resolve(compose_run([*data, "rollout.multi_turn.call_end='='"])).cfg, model_path)


def test_max_epochs_sets_the_steps_of_that_many_passes_over_the_training_records() -> None:
    """verl's total_epochs, RLinf's max_epochs: the shipped word problems' training split, 16 prompts a step."""
    import math

    from rlplace.cli import compose_run
    from rlplace.families import resolve
    from rlplace.reasoning.tasks import word_problems

    records = word_problems.SPLITS["train"]
    plan = resolve(compose_run(["experiment=gsm8k_grpo", "runner.max_epochs=3", "task.prompts_per_step=16"]))
    assert plan.cfg.runner.max_steps == math.ceil(3 * records / 16) != 100  # the preset's max_steps gives way
