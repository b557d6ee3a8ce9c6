"""Re-placing a running job (`runner.replace_at`): the plan of each placement the run switches to.

Each switch's plan is the run composed again from its own overrides with the preset in place of its placement
(`placement=...` and `cluster.component_placement=...` dropped): everything else, the seed and the sizes included,
stays what it was, so the run continues exactly from the checkpoint the switch writes (placement never changes
results). Every plan is resolved and checked before the first worker starts, so a switch that could not run is
refused then, exit 2, like any other bad input.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlplace.cli import compose_config
from rlplace.core.errors import ConfigError
from rlplace.families import Plan, resolve
from rlplace.placement import PlacementError

PLACEMENT_KEYS = ("placement=", "cluster.component_placement", "runner.replace_at=")
"""The overrides a switch's preset replaces."""


@dataclass(frozen=True)
class Switch:
    """After `step` steps, the run goes on as `plan` (placed as `preset`)."""

    step: int
    preset: str
    plan: Plan


def switches(plan: Plan, overrides: list[str]) -> list[Switch]:
    """The switches `plan.cfg.runner.replace_at` asks for, each with its resolved plan; ConfigError naming
    `runner.replace_at` for one that cannot run (an unknown preset: with Hydra's list of the valid ones, presets of
    your own from `hydra.searchpath` included)."""
    found = []
    kept = [arg for arg in overrides if not arg.lstrip("+~").startswith(PLACEMENT_KEYS)]
    for step, preset in plan.cfg.runner.switches().items():
        if preset == "auto":
            raise ConfigError(
                f"runner.replace_at = {step}:auto is invalid: a switch goes to a placement preset (valid: "
                "collocated, disaggregated, hybrid, the reasoning_* presets, or one of your own)"
            )
        try:
            found.append(Switch(step, preset, resolve(compose_config([*kept, f"placement={preset}"]))))
        except (ConfigError, PlacementError) as err:
            raise ConfigError(f"runner.replace_at = {step}:{preset}: {err}") from None
    return found
