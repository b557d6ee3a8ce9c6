"""A synthetic profile folder (profile.json, metrics.jsonl, timeline.json as a profiled run writes them), whose
numbers are round enough to check the planner's arithmetic by hand."""

from __future__ import annotations

import json
from pathlib import Path

from rlplace.placement import ComponentPlacement

ENVS, STEPS, EPOCHS, MINIBATCHES = 64, 16, 4, 4
MEASURED = {"sync_weights": 0.004, "offload": 0.002, "onload": 0.002, "generate_rollouts": 0.05}
MEASURED |= {"advantages": 0.001, "training": 0.08}
MEASURED["step"] = sum(MEASURED.values()) + 0.003


def line(base: float, per_item: float, sizes: list[int]) -> dict:
    return {"sizes": sizes, "seconds": [base + per_item * n for n in sizes]}


def profile_data(env_id: str = "CartPole-v1") -> dict:
    """profile.json of a 2-device hybrid run (env on device 0, rollout on 1, actor on both; one core per device)."""
    placement = ComponentPlacement(
        {"env": "0", "rollout": "1", "actor": "0-1"}, 1, 2, components=("env", "rollout", "actor")
    )
    run_sizes = [1, 2, 4, 8, 16, 32, 64]
    profile = {
        "family": "embodied",
        "env_id": env_id,
        "device_type": "cpu",
        "devices": {"0": [0], "1": [1]},
        "placement": placement.to_dict(),
        "config": {
            "total_num_envs": ENVS,
            "num_steps": STEPS,
            "pipeline_stage_num": 1,
            "update_epochs": EPOCHS,
            "num_minibatches": MINIBATCHES,
            "hidden_sizes": [64, 64],
            "max_staleness": 0,
            "offload": {"env": True, "rollout": True, "actor": True},
        },
        "env": line(1e-4, 4e-6, run_sizes),
        "rollout": line(2e-4, 2e-6, run_sizes),
        "actor": line(1e-3, 2e-5, [8, 16, 32, 64, 128, 256]),
        "average": {"ranks": 2, "seconds": 3e-4},
    }
    return profile


def write_profile(folder: Path, env_id: str = "CartPole-v1") -> Path:
    """A whole profiled run folder: `profile_data`, and the metrics and timeline its run recorded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "profile.json").write_text(json.dumps(profile_data(env_id)))
    rows = [{"step": s, **{f"time/{k}": v for k, v in MEASURED.items()}} for s in range(5)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = []
    for s in range(5):  # generation phases of 50 ms whose worker spans leave 1 ms at each end
        start = s * 1e6
        events.append({"name": "generate_rollouts", "ph": "X", "ts": start, "dur": 50e3})
        events += [{"name": "env_step", "ph": "X", "ts": start + 1e3 + i * 3e3, "dur": 1e3} for i in range(16)]
        events.append({"name": "rollout_infer", "ph": "X", "ts": start + 48e3, "dur": 1e3})
    (folder / "timeline.json").write_text(json.dumps({"traceEvents": events}))
    return folder
