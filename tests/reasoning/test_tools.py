"""The tools a response may call (`rollout.multi_turn.tool`): the calculator, and how a tool is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplace.core.errors import ConfigError
from rlplace.reasoning.config import MultiTurnConfig
from rlplace.reasoning.tools import TOOLS, ToolSet, calculator, tool_function


@pytest.mark.parametrize(
    ("call", "answer"),
    [
        ("37+45", "82"),
        (" (3 + 4) * 5 ", "35"),
        ("7/2", "3.5"),
        ("2/3", "0.666667"),
        ("1,234 x 2", "2468"),
        ("-3 - -2", "-1"),
        ("2**10", "1024"),
        ('{"name": "calculator", "arguments": {"expression": "3*4"}}', "12"),  # Qwen2.5's and Hermes' call format
        ('{"arguments": {"x": "9-10"}}', "-1"),
    ],
)
def test_the_calculator_evaluates_arithmetic(call: str, answer: str) -> None:
    assert calculator(call, {}) == answer


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("1/0", "error: division by zero"),
        ("9**9**9", "error: exponent 387420489 is above 64"),
        ("((10**64)**64)**64", "error: the result is above 1e100"),
        ("__import__('os')", "error: \"__import__('os')\" is not arithmetic"),
        ("", "error: "),
    ],
)
def test_the_calculator_answers_what_it_cannot_evaluate_with_an_error(call: str, error: str) -> None:
    assert calculator(call, {}).startswith(error)


def shouted(call: str, extra) -> str:
    return call.upper()


def test_a_tool_is_a_registered_name_a_module_function_or_a_file_function(tmp_path: Path) -> None:
    assert tool_function("calculator") is TOOLS["calculator"]
    assert tool_function(f"{__name__}:shouted")("ok", {}) == "OK"
    file = tmp_path / "my_tools.py"
    file.write_text("def lookup(call, extra):\n    return extra['table'][call]\n")
    assert tool_function(f"{file}:lookup")("a", {"table": {"a": "1"}}) == "1"
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool = 'calc' is invalid: valid: calculator, package"):
        MultiTurnConfig(tool="calc")
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool = '.*missing.py:lookup' cannot be loaded"):
        MultiTurnConfig(tool=str(tmp_path / "missing.py:lookup"))
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.response_template = 'no answer' is invalid: a text "):
        MultiTurnConfig(tool="calculator", response_template="no answer")


def test_several_tools_answer_the_calls_that_name_them(tmp_path: Path) -> None:
    """With a list of tools, a JSON call names the tool it calls (a registered one by its name, yours by its
    function's); a call naming none, or not JSON, is answered with an error the model reads. One tool takes every
    call, as before."""
    config = MultiTurnConfig(tool=["calculator", f"{__name__}:shouted"])
    tools = ToolSet(config.tool)
    assert tools('{"name": "calculator", "arguments": {"expression": "6*7"}}', {}) == "42"
    assert tools('{"name": "shouted", "arguments": {}}', {}) == '{"NAME": "SHOUTED", "ARGUMENTS": {}}'
    assert (
        tools('{"name": "search", "arguments": {}}', {}) == "error: the call names 'search'; tools: calculator, shouted"
    )
    assert tools("6*7", {}) == "error: the call names no tool; tools: calculator, shouted"
    assert ToolSet(MultiTurnConfig(tool="calculator").tool)("6*7", {}) == "42"
    assert MultiTurnConfig(tool=[]).tool is None and not MultiTurnConfig(tool=[]).enabled
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool = \['calculator', 'calculator'\] is invalid: two"):
        MultiTurnConfig(tool=["calculator", "calculator"])
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.tool = 3 is invalid: a tool, or a list of tools"):
        MultiTurnConfig(tool=3)
