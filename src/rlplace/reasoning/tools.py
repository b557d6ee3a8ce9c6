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


def tool_function(spec: str) -> Tool:
    """The tool `spec` names (`rollout.multi_turn.tool`): a registered name, `package.module:function` or
    `path/to/file.py:function`; ConfigError in one line naming the key, the value and what is valid otherwise."""
    valid = f"valid: {', '.join(TOOLS.names())}, package.module:function or path/to/file.py:function"
    return load_function(TOOLS, spec, valid, "a tool is a function (call, extra) -> str")
