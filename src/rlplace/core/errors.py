"""The one exception of a config that composes but cannot run, and the checks that raise it.

Every refusal names the key, the value and what would be valid, so the CLIs can print it as one line and exit 2
before Ray or any worker starts.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A config value that composes but cannot run; the message names the key, the value and what is valid."""


def check(ok: bool, key: str, value: Any, valid: str) -> None:
    """Raise ConfigError for `key` unless `ok`; `valid` says what would be accepted."""
    if not ok:
        raise ConfigError(f"{key} = {value!r} is invalid: {valid}")


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    check(value in choices, key, value, f"valid: {', '.join(choices)}")
