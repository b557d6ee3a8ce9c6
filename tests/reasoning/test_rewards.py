"""The built-in rewards on worked examples, the one scoring function every part of a run uses, and how a reward is
named (registered, by import path, by file path) or refused in one line."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlplace.core.errors import ConfigError
from rlplace.core.registry import absolute, load_file
from rlplace.reasoning.config import RewardConfig
from rlplace.reasoning.rewards import (
    OVERLONG,
    REWARDS,
    Decoded,
    OpenRLHFReward,
    RewardFunction,
    answer_format,
    boxed,
    check_remote_reward,
    gsm8k,
    gsm8k_number,
    last_boxed,
    reward_function,
    with_overlong_penalty,
)
from rlplace.reasoning.tasks.prompts import Problem

GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


def responses(*texts: str) -> Decoded:
    """`Decoded` texts for rewards of one response, which read the responses alone."""
    return Decoded(list(texts), [""] * len(texts), list(texts))


def score(reward, response: str, answer: str) -> float:
    return reward("How many clips?", response, answer, {})


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("She sold 72 clips.\n#### 72", "72", 1.0),
        ("#### 72", "72", 1.0),
        ("#### 72", GSM8K_SOLUTION, 1.0),  # the reference may be a whole GSM8K solution: its last `####` counts
        ("#### 1,234", "1234", 1.0),
        ("#### $72.00", "72", 1.0),
        ("#### 72.0", "#### 72", 1.0),
        ("#### 72.5", "72.50", 1.0),
        ("#### -3", "-3", 1.0),
        ("#### 7 then #### 72", "72", 1.0),  # the last marker wins
        ("#### 72 then #### 7", "72", 0.0),
        ("#### 73", "72", 0.0),
        ("72", "72", 0.0),  # no marker, no answer
        ("####", "72", 0.0),
        ("\\boxed{72}", "72", 0.0),
    ],
)
def test_gsm8k_reads_the_number_after_the_last_marker(response: str, answer: str, expected: float) -> None:
    assert score(gsm8k, response, answer) == expected


def test_gsm8k_number_normalises_commas_dollars_and_trailing_zeros() -> None:
    assert [gsm8k_number(t) for t in ("#### $1,234.50", "#### 72.0", "#### 0.0", "x #### 5 apples", "none")] == [
        "1234.5",
        "72",
        "0",
        "5",
        None,
    ]


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("\\boxed{72}", "72", 1.0),
        ("So the answer is $\\boxed{72}$.", "72", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # equal as numbers, not as strings
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{1+x}", "x+1", 1.0),
        ("\\boxed{3} no, \\boxed{72}", "72", 1.0),  # the last box counts
        ("\\boxed{72} no, \\boxed{3}", "72", 0.0),
        ("\\boxed{73}", "72", 0.0),
        ("#### 72", "72", 0.0),
        ("72", "72", 0.0),
        ("\\boxed{72", "72", 0.0),  # not closed
    ],
)
def test_boxed_compares_the_last_box_mathematically(response: str, answer: str, expected: float) -> None:
    assert score(boxed, response, answer) == expected
    assert REWARDS["math"] is boxed


def test_last_boxed_matches_braces() -> None:
    assert last_boxed("\\boxed{1} and \\boxed{\\frac{a}{b^{2}}} end") == "\\frac{a}{b^{2}}"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("She sold 72 clips.\n#### 72", 1.0),
        ("#### 72\n", 1.0),
        ("#### 1,234.5", 1.0),
        ("The answer is \\boxed{x+1}.", 1.0),
        ("#### 73", 1.0),  # the form, not the answer
        ("#### 72 clips", 0.0),
        ("#### 72\nor maybe 73", 0.0),  # the answer is not the last line
        ("72", 0.0),
        ("", 0.0),
    ],
)
def test_format_checks_the_form_of_the_last_line(response: str, expected: float) -> None:
    assert score(answer_format, response, "72") == expected


def test_with_format_adds_a_small_bonus_and_names_each_part() -> None:
    combined = reward_function("gsm8k_with_format")
    assert combined("q", "#### 72", "72", {}) == {"score": 1.1, "correct": 1.0, "format": 1.0}
    assert combined("q", "#### 73", "72", {}) == {"score": pytest.approx(0.1), "correct": 0.0, "format": 1.0}
    assert combined("q", "72", "72", {}) == {"score": 0.0, "correct": 0.0, "format": 0.0}
    assert reward_function("boxed_with_format")("q", "\\boxed{\\frac{1}{2}}", "0.5", {})["score"] == 1.1


def test_every_response_is_scored_through_one_function() -> None:
    """A float becomes {"score": it}; a dict keeps its names; a dict without "score", a non-number, or names that
    differ between responses are refused naming reward.function."""
    problems = [Problem("1+1=", "2"), Problem("2+2=", "4", extra={"unit": "apples"})]
    assert reward_function("exact_match").scores(problems, responses("2", "5")) == [{"score": 1.0}, {"score": 0.0}]
    seen = []

    def spy(prompt: str, response: str, answer: str, extra) -> dict[str, float]:
        seen.append((prompt, response, answer, dict(extra)))
        return {"score": 1, "length": len(response)}

    assert RewardFunction("spy", spy).scores(problems, responses("2", "four")) == [
        {"score": 1.0, "length": 1.0},
        {"score": 1.0, "length": 4.0},
    ]
    assert seen == [("1+1=", "2", "2", {}), ("2+2=", "four", "4", {"unit": "apples"})]
    with pytest.raises(TypeError, match="reward.function = 'bad' returned .*\"score\" entry is the training reward"):
        RewardFunction("bad", lambda *_: {"correct": 1.0})("q", "r", "a", {})
    with pytest.raises(TypeError, match="reward.function = 'bad' returned 'yes'"):
        RewardFunction("bad", lambda *_: "yes")("q", "r", "a", {})
    with pytest.raises(ValueError, match="reward.function = 'ragged' returned different names"):
        RewardFunction("ragged", lambda p, r, a, e: {"score": 1.0} | ({"x": 1.0} if r else {})).scores(
            problems, responses("", "y")
        )


USERS_FILE = """\
def graded(prompt, response, answer, extra):
    right = float(response.strip() == answer)
    return {"score": right, "right": right, "length": float(len(response))}

not_a_function = 3


def two_arguments(response, answer):
    return 1.0
"""

VERL_FILE = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source != "openai/gsm8k":
        raise NotImplementedError(data_source)
    right = float(solution_str.split("####")[-1].strip() == ground_truth)
    return {"score": right, "index": float(extra_info["index"])}


def without_extra_info(data_source, solution_str, ground_truth):
    return float(solution_str == ground_truth)
"""
"""Rewards written for verl (its `custom_reward_function.path`), which branch on the record's data source."""


def test_a_reward_is_named_by_registry_module_or_file(tmp_path: Path) -> None:
    file = tmp_path / "my_rewards.py"
    file.write_text(USERS_FILE)
    assert reward_function("exact_match").function is REWARDS["exact_match"]
    assert reward_function("tests.custom_reward:graded")("q", "so 3", "3", {}) == {
        "score": 1.0,
        "correct": 1.0,
        "length": 4.0,
    }
    by_file = reward_function(f"{file}:graded")
    assert by_file("q", "3", "3", {}) == {"score": 1.0, "right": 1.0, "length": 1.0}
    assert reward_function(f"{file}:graded").function is by_file.function  # the file runs once
    assert absolute("my_rewards.py:graded") == f"{Path.cwd() / 'my_rewards.py'}:graded"
    assert absolute("tests.custom_reward:graded") == "tests.custom_reward:graded"


def test_a_reward_written_for_verl_is_called_as_verl_calls_it(tmp_path: Path) -> None:
    file = tmp_path / "verl_rewards.py"
    file.write_text(VERL_FILE)
    record = {"data_source": "openai/gsm8k", "extra_info": {"split": "train", "index": 7}, "ability": "math"}
    problem = Problem("What is 48+24?", "72", extra=record)
    reward = reward_function(f"{file}:compute_score")
    assert reward.scores([problem, problem], responses("#### 72", "#### 71")) == [
        {"score": 1.0, "index": 7.0},
        {"score": 0.0, "index": 7.0},
    ]
    assert reward_function(f"{file}:without_extra_info")("q", "72", "72", record) == {"score": 1.0}


OPENRLHF_FILE = """\
import torch

calls = []


def reward_func(queries, prompts, labels):
    calls.append((queries, prompts, labels))
    rewards = torch.tensor([float(q[len(p):].startswith(l)) for q, p, l in zip(queries, prompts, labels)])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"length": torch.tensor([len(q) for q in queries])}}


def plain(queries, prompts, labels, **kwargs):
    return [0.5] * len(queries)


def ragged(queries, prompts, labels):
    return [1.0]
"""


def test_a_reward_written_for_openrlhf_scores_a_batch_as_openrlhf_calls_it(tmp_path: Path) -> None:
    """OpenRLHF's `reward_func(queries, prompts, labels)`: one call per batch with the prompts as the model was asked
    them and the queries with special tokens; its rewards and extra_logs become the named scores."""
    file = tmp_path / "reward_func.py"
    file.write_text(OPENRLHF_FILE)
    problems = [Problem("3+4=", "7"), Problem("40+2=", "42")]
    decoded = Decoded(["7", "41"], ["<s>3+4=", "<s>40+2="], ["<s>3+4=7</s>", "<s>40+2=41</s>"])
    reward = reward_function(f"{file}:reward_func")
    assert reward.scores(problems, decoded) == [{"score": 1.0, "length": 12.0}, {"score": 0.0, "length": 14.0}]
    assert load_file(str(file), "calls") == [(decoded.queries, decoded.prompts, ["7", "42"])]
    assert reward_function(f"{file}:plain").scores(problems, decoded) == [{"score": 0.5}, {"score": 0.5}]
    with pytest.raises(TypeError, match=r"'.*:ragged' returned \[1.0\]: an OpenRLHF reward returns 2 rewards"):
        reward_function(f"{file}:ragged").scores(problems, decoded)


class RewardServer(http.server.BaseHTTPRequestHandler):
    """A reward server as OpenRLHF's clients call one: JSON {"query", "prompts", "labels"} in, {"rewards",
    "extra_logs"} out; the bodies it received are kept on the server (`received`), and a server made with
    `failures = n` answers its first n requests with an error status."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append(body)  # type: ignore[attr-defined]
        if len(self.server.received) <= self.server.failures:  # type: ignore[attr-defined]
            self.send_error(503, "warming up")
            return
        triples = zip(body["query"], body["prompts"], body["labels"], strict=True)
        rewards = [float(query[len(prompt) :].startswith(label)) for query, prompt, label in triples]
        answer = json.dumps({"rewards": rewards, "extra_logs": {"length": [len(q) for q in body["query"]]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def reward_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RewardServer)
    server.received, server.failures = [], 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_reward_server_scores_a_batch_as_openrlhf_s_remote_reward_does(
    reward_server: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenRLHF's `--remote_rm_url http://...`: one POST per batch; a server that answers with an error status is
    asked again, and one that keeps failing is named; a URL where nothing listens is refused before any worker."""
    url = f"http://127.0.0.1:{reward_server.server_port}/get_reward"
    problems = [Problem("3+4=", "7"), Problem("40+2=", "42")]
    decoded = Decoded(["7", "41"], ["<s>3+4=", "<s>40+2="], ["<s>3+4=7</s>", "<s>40+2=41</s>"])
    check_remote_reward(url)
    reward = reward_function(url)
    assert reward.scores(problems, decoded) == [{"score": 1.0, "length": 12.0}, {"score": 0.0, "length": 14.0}]
    assert reward_server.received == [{"query": decoded.queries, "prompts": decoded.prompts, "labels": ["7", "42"]}]
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the waits between tries
    reward_server.failures = 2  # type: ignore[attr-defined]
    reward_server.received.clear()  # type: ignore[attr-defined]
    assert reward.scores(problems, decoded)[0]["score"] == 1.0 and len(reward_server.received) == 3
    reward_server.failures = 10  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match=rf"reward.function = '{url}': no answer after 3 tries: HTTP Error 503"):
        reward.scores(problems, decoded)
    reward_server.shutdown()
    reward_server.server_close()
    with pytest.raises(ConfigError, match=rf"^reward.function = '{url}' is invalid: nothing accepts a connection at"):
        check_remote_reward(url)
    with pytest.raises(ConfigError, match="a URL names its host"):
        reward_function("http:///get_reward")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{file}:two_arguments", "reward.function = '.*my_rewards.py:two_arguments' cannot be called as a reward"),
        ("exact", "reward.function = 'exact' is invalid: valid: exact_match, gsm8k, boxed"),
        ("tests.custom_reward:nothing_here", "reward.function = 'tests.custom_reward:nothing_here' cannot be imported"),
        ("no_such_module:f", "reward.function = 'no_such_module:f' cannot be imported .*; valid: exact_match"),
        ("tests.custom_reward:re", "reward.function = 'tests.custom_reward:re' is not callable"),
        ("missing/rewards.py:f", "reward.function = 'missing/rewards.py:f' cannot be loaded: no such file"),
        ("{file}:nothing_here", "reward.function = '.*my_rewards.py:nothing_here' cannot be loaded \\(AttributeError"),
        ("{file}:not_a_function", "reward.function = '.*my_rewards.py:not_a_function' is not callable"),
        ("{broken}:f", "reward.function = '.*broken.py:f' cannot be loaded \\(SyntaxError"),
    ],
)
def test_a_reward_that_cannot_be_used_is_refused_in_one_line(tmp_path: Path, spec: str, message: str) -> None:
    (tmp_path / "my_rewards.py").write_text(USERS_FILE)
    (tmp_path / "broken.py").write_text("def f(:\n")
    spec = spec.format(file=tmp_path / "my_rewards.py", broken=tmp_path / "broken.py")
    with pytest.raises(ConfigError, match=message) as refused:
        reward_function(spec)
    assert "\n" not in str(refused.value)
    assert "valid: " in str(refused.value) or "is not callable" in str(refused.value)


def test_a_short_response_is_scored_without_the_padding_after_it() -> None:
    """Responses travel right-padded with id 0, which in Qwen's and Llama 3's vocabularies is "!", not a special
    token: the reward must read only what was generated."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlplace.reasoning.workers.rollout import pack

    vocab = {"!": 0, "<eos>": 1, "=": 2, "+": 3, **{str(d): 4 + d for d in range(10)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="!"))
    words.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    words.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>")
    problems = [Problem("3+4=", "7"), Problem("40+2=", "42")]
    prompts = [tokenizer("3+4=")["input_ids"], tokenizer("40+2=")["input_ids"]]
    batch = pack(0, prompts, [[11, 1], [8, 6]], problems, width=6)  # "7<eos>", "42" (cut at max_new_tokens)
    assert batch.responses[0].tolist() == [11, 1, 0, 0, 0, 0]
    exact = reward_function("exact_match")
    decoded = exact.decode(tokenizer, batch.prompt_ids(), batch.response_ids())
    assert decoded == Decoded(["7", "42"], [], [])  # the prompts and queries only for a reward that reads them
    assert [s["score"] for s in exact.scores(problems, decoded)] == [1.0, 1.0]
    openrlhf = RewardFunction("openrlhf", OpenRLHFReward(lambda queries, prompts, labels: [0.0] * len(queries)))
    decoded = openrlhf.decode(tokenizer, batch.prompt_ids(), batch.response_ids())
    assert decoded == Decoded(["7", "42"], ["3+4=", "40+2="], ["3+4=7<eos>", "40+2=42"])
    assert tokenizer.batch_decode(batch.responses, skip_special_tokens=True)[0] == "7!!!!"  # what it read before


def test_the_overlong_penalty_falls_linearly_over_the_buffer() -> None:
    """DAPO's soft overlong punishment with 8 new tokens at most, a buffer of 4 and a factor of 0.5."""
    penalties = [with_overlong_penalty({"score": 1.0}, n, 8, 4, 0.5)[OVERLONG] for n in range(9)]
    assert penalties == [0.0] * 5 + [-0.125, -0.25, -0.375, -0.5]
    assert with_overlong_penalty({"score": 1.0, "correct": 1.0}, 7, 8, 4, 0.5) == {
        "score": 0.625,
        "correct": 1.0,
        "overlong_penalty": -0.375,
    }
    with pytest.raises(ConfigError, match="reward.overlong_buffer = -1 is invalid: 0 .off. or more tokens"):
        RewardConfig(overlong_buffer=-1)
