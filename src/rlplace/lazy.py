"""A package's names imported on first use (PEP 562), for packages whose modules must not all load at once: Ray
imports a worker's package in its process, and a process that needs one light module must not import torch through
its siblings."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, module_of: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `name` from its submodule `module_of[name]` when first
    asked for; other names are an AttributeError, as for any module."""

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)

    return __getattr__
