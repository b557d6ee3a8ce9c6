"""The scheduler's modules import each other at the top, not inside functions where an import cycle would hide, and
only `session.py` reaches into Ray's private modules. (That no import cycle exists, here or anywhere in the package,
is `tests/test_imports.py`.) Static checks, no Ray started."""

from __future__ import annotations

import ast
from pathlib import Path

import rlplace.scheduler

SCHEDULER = "rlplace.scheduler"
TORCH_MODULES = {f"{SCHEDULER}.collective", f"{SCHEDULER}.group_mean"}
"""Scheduler modules that import torch: `worker.py` imports them on first use, so that a worker process that never
touches torch (a simulator) does not load it."""


def test_scheduler_modules_import_each_other_at_the_top() -> None:
    """A function-local import of a scheduler module is kept only to load torch late (`TORCH_MODULES`)."""
    local = []
    for path in sorted(Path(rlplace.scheduler.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in functions:
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(SCHEDULER):
                    if node.module not in TORCH_MODULES:
                        local.append(f"{path.name}:{node.lineno} {node.module}")
    assert local == []


def test_only_the_session_module_reaches_into_ray_private() -> None:
    """What Ray offers no public API for is used in one module, so a Ray upgrade that moves it breaks one file."""
    folder = Path(rlplace.scheduler.__file__).parent
    reaching = [path.name for path in sorted(folder.glob("*.py")) if _uses_ray_private(ast.parse(path.read_text()))]
    assert reaching == ["session.py"]


def _uses_ray_private(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ray._private"):
            return True
        if isinstance(node, ast.Import) and any(alias.name.startswith("ray._private") for alias in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "_private" and getattr(node.value, "id", None) == "ray":
            return True
    return False
