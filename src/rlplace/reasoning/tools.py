"""Tools a reasoning policy may call in the middle of a response (`rollout.multi_turn.tool`).

A tool is a function `(call, extra) -> str`: `call` is the text the model wrote between `rollout.multi_turn.call_start`
and `call_end`, `extra` the problem's record fields (`Problem.extra`: a verl record's `extra_info` travels there),
and the text returned is what the model reads next (`generation.turns`). Tools are chosen as rewards are: a registered
name, `package.module:function`, or `path/to/file.py:function`. Pure Python: the name is checked on the driver before
anything starts; a rollout rank loads the function where it generates.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry, load_function

KEY = "rollout.multi_turn.tool"
RESULT = "{result}"
"""Where rollout.multi_turn.response_template puts the tool's answer."""
Tool = Callable[[str, Mapping[str, Any]], str]

TOOLS: Registry[Tool] = Registry(KEY)

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_EXPONENT = 64
"""The largest exponent `calculator` raises to: a model's `9**9**9` would otherwise keep the rollout busy for good."""
MAX_MAGNITUDE = 10**100
"""The largest value `calculator` computes on: powers of powers stay small enough to evaluate and print."""


@TOOLS.register("calculator")
def calculator(call: str, extra: Mapping[str, Any]) -> str:
    """The value of an arithmetic expression (numbers, `+ - * / // % **`, parentheses, signs; `x` and `×` read as
    `*`, thousands separators dropped), evaluated on its syntax tree, never by `eval`: the tool an arithmetic or
    GSM8K policy learns to call rather than computing in its head. The call is the expression, or a JSON call as
    Qwen2.5's and Hermes' chat templates write them (`{"name": "calculator", "arguments": {"expression": "3*4"}}`:
    the `expression` argument, or the only one). A whole value prints without a decimal point, any other rounded to
    6 decimals. What cannot be evaluated answers `error: ...`, which the model reads as it would any response."""
    text = _expression(call).strip().replace("×", "*").replace("x", "*").replace(",", "")
    try:
        value = _evaluate(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ArithmeticError, RecursionError) as error:
        return f"error: {error}" if str(error) else f"error: {type(error).__name__}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.6f}".rstrip("0").rstrip(".")


def _expression(call: str) -> str:
    """The expression of a call: the text itself, or a JSON call's `expression` argument (or its only one)."""
    try:
        parsed = json.loads(call)
    except ValueError:
        return call
    arguments = parsed.get("arguments", parsed) if isinstance(parsed, dict) else None
    if not isinstance(arguments, dict):
        return call
    if "expression" in arguments:
        return str(arguments["expression"])
    return str(next(iter(arguments.values()))) if len(arguments) == 1 else call


def _evaluate(node: ast.expr) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
        value = _OPERATORS[type(node.op)](left, right)
        if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError("the result is not a finite real number")
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError("the result is above 1e100")
        return value
    raise ValueError(f"{ast.unparse(node)!r} is not arithmetic")


def tool_name(spec: str) -> str:
    """The name a call gives the tool `spec` names: a registered tool's name, or its function's (after the `:`)."""
    return spec.rpartition(":")[2]


def tool_specs(value: Any) -> list[str]:
    """rollout.multi_turn.tool as a list: null is no tool, a string one, a list several. ConfigError in one line when
    it is none of them, or when two tools have one name (a call names the tool it calls)."""
    specs = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(specs, list | tuple) or not all(isinstance(spec, str) for spec in specs):
        raise ConfigError(f"{KEY} = {value!r} is invalid: a tool, or a list of tools")
    names = [tool_name(spec) for spec in specs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(
            f"{KEY} = {value!r} is invalid: two tools are named {twice[0]!r} (a call names the tool it calls); valid: "
            "tools of different names"
        )
    return list(specs)


class ToolSet:
    """The tools of a run, answering each call: with one tool, every call is that tool's; with several, a call names
    its tool as the JSON calls of Qwen2.5's and Hermes' chat templates do (`{"name": "calculator", "arguments":
    ...}`), and one that names none of them is answered with an error the model reads, as a tool's own errors are."""

    def __init__(self, specs: list[str]) -> None:
        self.tools = {tool_name(spec): tool_function(spec) for spec in specs}

    def __call__(self, call: str, extra: Mapping[str, Any]) -> str:
        if len(self.tools) == 1:
            return str(next(iter(self.tools.values()))(call, extra))
        name = _called_name(call)
        if name not in self.tools:
            called = "names no tool" if name is None else f"names {name!r}"
            return f"error: the call {called}; tools: {', '.join(self.tools)}"
        return str(self.tools[name](call, extra))


def _called_name(call: str) -> str | None:
    """The `name` of a JSON call; None when the call is not one."""
    try:
        parsed = json.loads(call)
    except ValueError:
        return None
    name = parsed.get("name") if isinstance(parsed, dict) else None
    return name if isinstance(name, str) else None


def tool_function(spec: str) -> Tool:
    """The tool `spec` names (`rollout.multi_turn.tool`): a registered name, `package.module:function` or
    `path/to/file.py:function`; ConfigError in one line naming the key, the value and what is valid otherwise."""
    valid = f"valid: {', '.join(TOOLS.names())}, package.module:function or path/to/file.py:function"
    return load_function(TOOLS, spec, valid, "a tool is a function (call, extra) -> str")
