"""The planner is arithmetic over a profile: importing it must start nothing and load neither Ray nor torch, so that
`rlplace-plan` answers at once and scores thousands of placements (the import contracts check the static graph;
this checks what an import really loads)."""

from __future__ import annotations

import subprocess
import sys

PURE = (
    "rlplace.planner",
    "rlplace.embodied.planning",
    "rlplace.reasoning.planning",
    "rlplace.reasoning.memory",
    "rlplace.core.schedule",
    "rlplace.placement",
)


def test_planner_imports_neither_ray_nor_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {PURE!r}: importlib.import_module(name)\n"
        "print(' '.join(m for m in ('ray', 'torch', 'hydra') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"the planner's imports loaded {done.stdout.strip()}"
