"""Re-placing a running job: the placements a run goes on in, and when it moves.

Two ways to move: `runner.replace_at` names the steps and the presets; `runner.replan_interval` lets the planner
decide, every so many steps, from the run's own profile (`plan.profile`, or `placement=auto`'s). A manual switch's
plan is the run composed again from its own overrides with the preset in place of its placement (`placement=...`
and `cluster.component_placement=...` dropped): everything else, the seed and the sizes included, stays, so the run
continues exactly from the checkpoint the switch writes (placement never changes results). Manual switches are
resolved and checked before the first worker starts, so one that could not run is refused then, exit 2.

A planned switch: the fastest placement of the planner's search at the run's staleness, its predicted step scaled
by what the run measured against the prediction for its current placement (the model's error on this run, on this
machine), is worth it when the time it saves over the remaining steps exceeds `runner.replan_margin` times what a
switch costs: the run's own start-up until the first switch, then the last switch's measured time.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, replace
from typing import Any

from rlplace.cli import compose_config
from rlplace.core.errors import ConfigError
from rlplace.families import Plan, choose, resolve
from rlplace.placement import HybridComponentPlacement, PlacementError

PLACEMENT_KEYS = ("placement=", "cluster.component_placement", "runner.replace_at=")
"""The overrides a switch's preset replaces."""
log = logging.getLogger("rlplace")


@dataclass(frozen=True)
class Switch:
    """After `step` steps, the run goes on as `plan` (`to`: the preset, or the planner's overrides)."""

    step: int
    to: str
    plan: Plan


def switches(plan: Plan, overrides: list[str]) -> list[Switch]:
    """The switches `plan.cfg.runner.replace_at` asks for, each with its resolved plan; ConfigError naming
    `runner.replace_at` for one that cannot run (an unknown preset: with Hydra's list of the valid ones, presets of
    your own from `hydra.searchpath` included), or `runner.replan_interval` for a run the planner cannot plan."""
    runner = plan.cfg.runner
    if runner.replan_interval is not None and plan.cfg.plan.profile is None:
        raise ConfigError(
            f"runner.replan_interval = {runner.replan_interval} is invalid here: the planner re-plans from a profile "
            "(valid: with plan.profile=<a run trained with runner.profile=true>, or placement=auto)"
        )
    found = []
    kept = [arg for arg in overrides if not arg.lstrip("+~").startswith(PLACEMENT_KEYS)]
    for step, preset in runner.switches().items():
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


class Schedule:
    """The placement a run is in, and whether it moves after a step (`due`, which the runner asks after each one;
    then `take` gives the switch)."""

    def __init__(self, plan: Plan, manual: list[Switch], history: list[dict[str, float]]) -> None:
        self.current = plan
        self.manual = {switch.step: switch for switch in manual}
        self.history = history
        """The run's metrics, step by step (the driver's list, which the runner appends to)."""
        self.cost_s = 0.0
        """What moving the run costs, measured: its start-up until it first moves, then its last switch."""
        self.decisions: list[dict[str, Any]] = []
        self._next: Switch | None = None

    def due(self, steps: int) -> bool:
        """Whether the run moves after `steps` steps: a manual switch there, or, every runner.replan_interval
        steps, the planner's."""
        interval = self.current.cfg.runner.replan_interval
        if steps in self.manual:
            self._next = self.manual[steps]
        elif interval and steps % interval == 0:
            self._next = self._replan(steps, interval)
        return self._next is not None

    def take(self) -> Switch:
        switch, self._next = self._next, None
        assert switch is not None, "take() follows a due() that said yes"
        self.current = switch.plan
        return switch

    def _replan(self, steps: int, interval: int) -> Switch | None:
        cfg = self.current.cfg
        measured = statistics.median(row["time/step"] for row in self.history[-interval:])
        chosen, ranking = choose(self.current.family, cfg)
        best = ranking[0]
        scale = measured / self.current.prediction.step_s  # the model's error on this run
        remaining = cfg.runner.max_steps - steps
        gain = (measured - best.prediction.step_s * scale) * remaining
        placement = HybridComponentPlacement(chosen)
        # The placement, or what else the candidate sets (stages, offloading), is not the run's.
        moved = placement.to_dict()["components"] != self.current.placement.to_dict()["components"] or (
            replace(chosen, cluster=cfg.cluster) != cfg
        )
        worth = moved and gain > cfg.runner.replan_margin * self.cost_s
        self.decisions.append(
            {"step": steps, "switched": worth, "to": best.overrides, "predicted_gain_s": gain, "cost_s": self.cost_s}
        )
        what = "moving to" if worth else ("staying; the fastest would be" if moved else "staying: the fastest is")
        log.info(
            f"rlplace: re-plan after step {steps}: {what} {best.overrides} (predicted to save {gain:.1f} s over the "
            f"{remaining} steps left; a switch costs {self.cost_s:.1f} s x margin {cfg.runner.replan_margin:g})"
        )
        if not worth:
            return None
        return Switch(steps, best.overrides, Plan(self.current.family, chosen, placement, ranking, best.prediction))
