"""The interface every task family's launcher implements: how `rlplace-train` starts, runs and reports a run.

A launcher is a module (`rlplace.embodied.launch`, `rlplace.reasoning.launch`) whose functions match `Launcher`;
`rlplace.families` names each family's launcher and imports it only when a run starts (it imports torch and the
worker classes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the interface must import neither Ray nor torch: the CLIs check configs before either loads
    from rlplace.core.runner import Runner
    from rlplace.metrics import MetricLogger, Timeline
    from rlplace.scheduler import Cluster


@dataclass(frozen=True)
class Carried:
    """What a re-placed run's runner hands the runner of its next placement, so that the run's final rates cover
    the whole run, switches included, not its last placement alone (`Runner.carry`)."""

    loop_start: float
    """`time.perf_counter()` when the run's first placement started its loop."""
    counters: dict[str, float]
    """The family's counters of the run so far (env steps before the loop, tokens, evaluation seconds)."""


@dataclass
class RunContext:
    """What the driver gives a family's runner: where the run writes, and what it logs to."""

    run_dir: Path
    logger: MetricLogger
    history: list[dict[str, float]]
    """Every step's metrics, appended as the run goes (the driver summarises them)."""
    predicted_step_s: float | None = None
    """The planner's prediction of this run's step time (`plan.profile` given): each step logs it and its error."""
    timeline: Timeline | None = None
    """The run's timeline so far, when the runner takes over a re-placed run (`runner.replace_at`); None: a new one."""
    carried: Carried | None = None
    """What the runner of the run's previous placement handed on (`Runner.carry`); None: the run's first."""


class Launcher(Protocol):
    """What `rlplace-train` asks of a family, in the order it asks."""

    def check_checkpoint(self, cfg: Any, folder: Path) -> None:
        """Refuse, before any worker starts, a checkpoint this run cannot continue exactly (ConfigError, one line)."""

    def run_labels(self, cfg: Any) -> dict[str, Any]:
        """What tells this run apart from others of a sweep besides its mode (run.json, wandb tags)."""

    def start(self, cfg: Any, cluster: Cluster) -> Any:
        """Start the run's worker groups without waiting for them; returns what `runner` needs to wait on."""

    def runner(self, cfg: Any, starting: Any, context: RunContext) -> Runner[Any, Any, Any, Any]:
        """Wait for the started groups and build the family's runner."""

    def summary(self, cfg: Any, mode: str, final: dict[str, float], run_dir: Path) -> tuple[str, float]:
        """The closing line, and the sweep objective."""
