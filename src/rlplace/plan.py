"""`rlplace-plan`: the run's config and placement, resolved and printed, with nothing started.

It takes the same overrides as `rlplace-train` and goes through the same resolution (`resolve`), so what it
prints is what training would do. It composes with Hydra's compose API rather than `@hydra.main`: a plan writes
no output folder and sets up no logging, and answers in well under a second of its own.

With `plan.profile=<run folder>` (a run trained with `runner.profile=true`) it also predicts the composed run's step
time, and with `plan.search=true` ranks every placement, stage count and staleness the cluster can run
(the family's step model: `rlplace.embodied.planning`, `rlplace.reasoning.planning`): arithmetic over the profile,
no Ray, so a cluster larger than the profiling machine is planned as fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from rlplace.cli import compose_run, import_from_start_directory, resolve_or_fail
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


def predictions(plan: Plan) -> dict[str, Any]:
    """With `plan.profile`: the predicted step of this run, and with `plan.search` the ranked candidates (the run's
    family's step model); a profile that cannot serve the run exits 2 naming the key (`resolve`)."""
    cfg = plan.cfg
    if cfg.plan.profile is None:
        return {}
    found: dict[str, Any] = {"prediction": plan.prediction.to_dict()}
    if cfg.plan.search:
        found["search"] = [r.to_dict() for r in plan.family.search(cfg)[: cfg.plan.top]]
    return found


def render_predictions(found: dict[str, Any], console: Console) -> None:
    prediction = found["prediction"]
    phases = ", ".join(f"{name} {seconds:.3f}" for name, seconds in prediction["phases"].items())
    unit, rate = next(iter(prediction["throughput"].items()))
    console.print(f"predicted: {prediction['step_s']:.3f} s per step, {rate:,.0f} {unit.replace('_', ' ')} ({phases})")
    if "search" in found:
        ranked = Table(title="fastest placements (predicted)")
        components = list(found["search"][0]["component_placement"]) if found["search"] else []
        staged = bool(found["search"]) and "stages" in found["search"][0]
        split = bool(found["search"]) and "tensor_parallel_size" in found["search"][0]
        columns = ["#", "mode", *components, *(["stages"] if staged else []), *(["rollout split"] if split else [])]
        columns += ["staleness", "step s", unit]
        for column in columns:
            ranked.add_column(column.replace("_", " "))
        for i, r in enumerate(found["search"], 1):
            p = r["prediction"]
            ranked.add_row(
                str(i),
                r["mode"],
                *(str(r["component_placement"][name]) for name in components),
                *([str(r["stages"])] if staged else []),
                *([str(r["tensor_parallel_size"])] if split else []),
                str(r["max_staleness"]),
                f"{p['step_s']:.3f}",
                f"{p['throughput'][unit]:,.0f}",
            )
        console.print(ranked)
        for i, r in enumerate(found["search"], 1):
            console.print(f"#{i}: {r['overrides']}", soft_wrap=True, highlight=False)
    console.print("assumptions: " + "; ".join(prediction["assumptions"]))


def memory(plan: Plan) -> dict[str, Any]:
    """The family's predicted device memory, where it has a model of it and the model's shape is known."""
    predicted = plan.family.memory(plan.cfg, plan.placement) if plan.family.memory is not None else None
    return {} if predicted is None else {"memory": predicted.to_dict()}


def render_memory(found: dict[str, Any], console: Console) -> None:
    table = Table(title=f"predicted device memory, GB (sequences of {found['seq_len']} tokens)")
    phases = list(dict.fromkeys(phase for by_phase in found["devices_gb"].values() for phase in by_phase))
    table.add_column("device", justify="right")
    for phase in phases:
        table.add_column(phase, justify="right")
    for device, by_phase in sorted(found["devices_gb"].items()):
        table.add_row(str(device), *(f"{by_phase.get(phase, 0.0):.3g}" for phase in phases))
    console.print(table)
    shares = ", ".join(
        f"{name} {u['resident']:.3g} resident / {u['peak']:.3g} at peak" for name, u in found["components_gb"].items()
    )
    console.print(f"per rank: {shares}")
    if found["measured_from"]:
        console.print(f"scaled per component and phase by the peaks measured in {found['measured_from']}")


def print_plan(plan: Plan) -> None:
    found = {**predictions(plan), **memory(plan)}
    if plan.cfg.plan.format == "json":
        print(json.dumps({**plan.placement.to_dict(), **found}))
        return
    console = Console()
    render_table(plan, console)
    if "memory" in found:
        render_memory(found["memory"], console)
    if "prediction" in found:
        render_predictions(found, console)


def main(argv: list[str] | None = None) -> None:
    import_from_start_directory()
    print_plan(resolve_or_fail(compose_run(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
