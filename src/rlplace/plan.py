"""`rlplace-plan`: the run's config and placement, resolved and printed, with nothing started.

It takes the same overrides as `rlplace-train` and goes through the same resolution (`resolve`), so what it
prints is what training would do. It composes with Hydra's compose API rather than `@hydra.main`: a plan writes
no output folder and sets up no logging, and answers in well under a second of its own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.table import Table

from rlplace.config import ConfigError, TrainConfig, register, to_typed
from rlplace.placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementError,
)
from rlplace.runners.checks import check_embodied, check_reasoning

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
"""The Hydra config tree at the repository root (the project installs editable)."""

EXIT_BAD_CONFIG = 2


@dataclass
class Plan:
    """A resolved run: typed config plus the placement of every component."""

    cfg: TrainConfig
    placement: ComponentPlacement


def resolve(cfg: DictConfig) -> Plan:
    """Turn a composed config into a checked plan; raises ConfigError or PlacementError naming key and value."""
    typed = to_typed(cfg)
    if typed.task.is_reasoning:
        placement: ComponentPlacement = ModelParallelComponentPlacement(typed)
        check_reasoning(typed, placement)
    else:
        placement = HybridComponentPlacement(typed)
        check_embodied(typed, placement)
    return Plan(typed, placement)


def render_table(plan: Plan, console: Console) -> None:
    """Per component: processes and node:devices per rank; per device: who shares it; and the mode."""
    placement = plan.placement
    components = Table(title=f"placement: {placement.mode} mode, {placement.num_devices} devices")
    components.add_column("component")
    components.add_column("processes", justify="right")
    components.add_column("rank: node:devices")
    for name in placement.components:
        ranks = placement.get_placements(name)
        where = "  ".join(f"{p.rank}: {p.node_rank}:{','.join(map(str, p.devices)) or 'cpu'}" for p in ranks)
        components.add_row(name, str(len(ranks)), where)
    console.print(components)
    sharing = Table(title="devices")
    sharing.add_column("device", justify="right")
    sharing.add_column("components")
    for device, names in placement.device_sharing().items():
        sharing.add_row(str(device), ", ".join(names) or "(idle)")
    console.print(sharing)


def print_plan(plan: Plan) -> None:
    if plan.cfg.plan.format == "json":
        print(json.dumps(plan.placement.to_dict()))
    else:
        render_table(plan, Console())


def fail(message: str) -> None:
    """Report a refused config as one line on stderr and exit with code 2."""
    print(f"rlplace: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_CONFIG)


def describe_compose_error(err: Exception) -> str:
    """One line from Hydra's composition error and its cause (which says what the value should have been)."""
    parts = [" ".join(str(err).split("Config search path")[0].split())]
    if err.__cause__ is not None:
        parts.append(str(err.__cause__).splitlines()[0])
    return ": ".join(parts)


def main(argv: list[str] | None = None) -> None:
    register()
    overrides = sys.argv[1:] if argv is None else argv
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides)
        plan = resolve(cfg)
    except (ConfigError, PlacementError) as err:
        fail(str(err))
    except (HydraException, OmegaConfBaseException) as err:
        fail(describe_compose_error(err))
    print_plan(plan)


if __name__ == "__main__":
    main()
