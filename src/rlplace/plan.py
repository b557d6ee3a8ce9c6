"""`rlplace-plan`: the run's config and placement, resolved and printed, with nothing started.

It takes the same overrides as `rlplace-train` and goes through the same resolution (`resolve`), so what it
prints is what training would do. It composes with Hydra's compose API rather than `@hydra.main`: a plan writes
no output folder and sets up no logging, and answers in well under a second of its own.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from rlplace.cli import compose_run, resolve_or_fail
from rlplace.families import Plan


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


def main(argv: list[str] | None = None) -> None:
    print_plan(resolve_or_fail(compose_run(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
