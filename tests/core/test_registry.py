"""Registry: names in, one-line refusals out, each name taken once."""

from __future__ import annotations

import pytest

from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry


def test_entries_by_name_and_the_refusal_names_key_value_and_valid_names() -> None:
    shapes: Registry[int] = Registry("model.shape")
    shapes.register("small", 1)

    @shapes.register("large")
    def large() -> int:
        return 2

    assert shapes["small"] == 1 and shapes["large"] is large and shapes.names() == ("small", "large")
    assert "small" in shapes and list(shapes) == ["small", "large"]
    with pytest.raises(ConfigError, match=r"^model.shape = 'medium' is invalid: valid: small, large$"):
        shapes.check("medium")


def test_a_name_is_taken_once() -> None:
    shapes: Registry[int] = Registry("model.shape")
    shapes.register("small", 1)
    shapes.register("small", 1)  # the same entry again (a module imported twice): no change
    with pytest.raises(ValueError, match="'small' is registered already"):
        shapes.register("small", 2)
