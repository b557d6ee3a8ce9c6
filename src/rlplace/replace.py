"""Re-placing a running job: the placements a run goes on in, and when it moves.

Two ways to move: `runner.replace_at` names the steps and the presets; `runner.replan_interval` lets the planner
decide, every so many steps, from the run's own measurements. A manual switch's plan is the run composed again from
its own overrides with the preset in place of its placement (`placement=...` and `cluster.component_placement=...`
dropped): everything else, the seed and the sizes included, stays, so the run continues exactly from the checkpoint
the switch writes (placement never changes results). Manual switches are resolved and checked before the first
worker starts, so one that could not run is refused then, exit 2.

A planned switch: every `runner.replan_interval` steps the run writes a profile of its own last steps (`own_profile`:
the units' costs alone from `plan.profile`, or `placement=auto`'s profiling run, with this run's placement, sizes,
metrics and timeline), so the step model calibrates what the loop adds to the units (hand-offs, overheads, phase
switches, weight sync, how much slower a unit runs inside the loop) on this run as it runs now; the planner's search
from that profile ranks the placements at the run's staleness. The fastest one's predicted step, scaled by what the
run measured against that model's prediction for where it is (what calibration leaves unexplained), is worth moving
to when the time it saves over the remaining steps exceeds `runner.replan_margin` times what a switch costs: the
run's own start-up until the first switch, then the last switch's measured time. A run whose last steps cannot
calibrate the model (a step the model cannot reproduce) is planned from `plan.profile` itself, and says so.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlplace.cli import compose_config
from rlplace.core.errors import ConfigError
from rlplace.core.timing import where_it_ran
from rlplace.families import Plan, choose, resolve
from rlplace.metrics import Timeline
from rlplace.metrics.logger import METRICS_FILE
from rlplace.metrics.timeline import Span
from rlplace.placement import HybridComponentPlacement, PlacementError
from rlplace.planner import PROFILE_FILE, ProfileError
from rlplace.planner.profile import TIMELINE_FILE

OWN_PROFILES = "replans"
"""The run folder's sub-folder that holds the profile each re-plan writes of the run's own last steps."""
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

    def __init__(self, plan: Plan, manual: list[Switch], history: list[dict[str, float]], run_dir: Path) -> None:
        self.current = plan
        self.manual = {switch.step: switch for switch in manual}
        self.history = history
        """The run's metrics, step by step (the driver's list, which the runner appends to)."""
        self.run_dir = run_dir
        self.profile = plan.cfg.plan.profile
        """The profiled run whose units every re-plan starts from."""
        self.cost_s = 0.0
        """What moving the run costs, measured: its start-up until it first moves, then its last switch."""
        self.decisions: list[dict[str, Any]] = []
        self._next: Switch | None = None
        self._ends: list[float] = []
        """When each step the run asked about ended (unix time)."""
        self._watched: tuple[Timeline, dict[int, list[int]], dict[int, list[int]]] | None = None

    def watch(self, timeline: Timeline, cores: dict[int, list[int]], node_cores: dict[int, list[int]]) -> None:
        """What a re-plan's own profile is made of, besides the run's metrics: its timeline (the current runner's)
        and the cores of its cluster's devices and nodes."""
        self._watched = (timeline, cores, node_cores)

    def due(self, steps: int) -> bool:
        """Whether the run moves after `steps` steps: a manual switch there, or, every runner.replan_interval
        steps, the planner's."""
        self._ends.append(time.time())
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
        rows = self.history[-interval:]
        measured = statistics.median(row["time/step"] for row in rows)
        try:
            planned = replace(cfg, plan=replace(cfg.plan, profile=str(self._own_profile(steps, rows))))
            chosen, ranking, here = self._rank(planned)
        except (ConfigError, ProfileError) as err:
            log.warning(
                f"rlplace: re-plan after step {steps} from {self.profile}: its own last steps cannot calibrate "
                f"the step model ({err})"
            )
            planned = replace(cfg, plan=replace(cfg.plan, profile=self.profile))
            chosen, ranking, here = self._rank(planned)
        best = ranking[0]
        scale = measured / here.step_s  # what the model, calibrated or not, leaves unexplained on this run
        remaining = cfg.runner.max_steps - steps
        gain = (measured - best.prediction.step_s * scale) * remaining
        placement = HybridComponentPlacement(chosen)
        # The placement, or what else the candidate sets (stages, offloading), is not the run's.
        moved = placement.to_dict()["components"] != self.current.placement.to_dict()["components"] or (
            replace(chosen, cluster=cfg.cluster, plan=cfg.plan) != cfg
        )
        worth = moved and gain > cfg.runner.replan_margin * self.cost_s
        self.decisions.append(
            {
                "step": steps,
                "switched": worth,
                "to": best.overrides,
                "predicted_gain_s": gain,
                "cost_s": self.cost_s,
                "profile": str(planned.plan.profile),
            }
        )
        what = "moving to" if worth else ("staying; the fastest would be" if moved else "staying: the fastest is")
        log.info(
            f"rlplace: re-plan after step {steps}: {what} {best.overrides} (predicted to save {gain:.1f} s over the "
            f"{remaining} steps left; a switch costs {self.cost_s:.1f} s x margin {cfg.runner.replan_margin:g})"
        )
        if not worth:
            return None
        return Switch(steps, best.overrides, Plan(self.current.family, chosen, placement, ranking, best.prediction))

    def _rank(self, planned: Any) -> tuple[Any, list[Any], Any]:
        """The run placed as the fastest candidate of `planned`'s profile, the ranking, and that profile's
        prediction for where the run is now."""
        chosen, ranking = choose(self.current.family, planned)
        return chosen, ranking, self.current.family.predict(planned, self.current.placement)

    def _own_profile(self, steps: int, rows: list[dict[str, float]]) -> Path:
        """The profile of the run's last `rows` (`own_profile`), in the run folder."""
        assert self._watched is not None, "the driver watches each placement's timeline before its steps run"
        timeline, cores, node_cores = self._watched
        since = self._ends[-len(rows) - 1] if len(self._ends) > len(rows) else 0.0
        numbered = [{"step": steps - len(rows) + i, **row} for i, row in enumerate(rows)]
        spans = [span for span in timeline.spans if span["start"] >= since]
        folder = self.run_dir / OWN_PROFILES / f"step_{steps:06d}"
        return own_profile(folder, self.profile, self.current, cores, node_cores, numbered, spans, timeline)


def own_profile(
    folder: Path,
    profiled: str,
    plan: Plan,
    cores: Mapping[int, list[int]],
    node_cores: Mapping[int, list[int]],
    rows: Sequence[dict[str, float]],
    spans: Sequence[Span],
    timeline: Timeline,
) -> Path:
    """Write a profile of a running run's last steps to `folder`: the units alone of the profiled run `profiled`
    (profile.json's curves and timed passes), with the run's own placement, cores and sizes, its metric `rows` and
    its timeline `spans` of those steps (`timeline`: where each process ran). `rlplace-plan plan.profile=<folder>`
    reads it like any profile."""
    data = json.loads((Path(profiled) / PROFILE_FILE).read_text())
    data.update(where_it_ran(plan.cfg.cluster.device_type, cores, node_cores, plan.placement))
    data["config"] = plan.family.shape(plan.cfg)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROFILE_FILE).write_text(json.dumps(data))
    (folder / METRICS_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
    devices = {(span["group"], span["rank"]): timeline.devices_of(span["group"], span["rank"]) for span in spans}
    window = Timeline(devices, start=timeline.start)
    window.extend(spans)
    window.write(folder / TIMELINE_FILE)
    return folder
