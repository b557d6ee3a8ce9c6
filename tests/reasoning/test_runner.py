"""The reasoning loop end to end, as users run it: `rlplace-train experiment=arithmetic_grpo...` in a subprocess on
an embedded local Ray, from a tiny LM folder built here (not pretrained: these tests are about behaviour, not
accuracy; the accuracy gain is measured by the experiment itself and recorded in README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlplace.metrics import Timeline
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm

TINY = [
    "task.min_digits=1",
    "task.max_digits=1",
    "task.operations=+",
    "task.eval_size=16",
    "task.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.num_minibatches=2",
    "rollout.micro_batch_prompts=2",
    "rollout.max_new_tokens=4",
    "runner.max_steps=2",
    "runner.eval_interval=1",
    "logger=jsonl",
]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def train(run_dir: Path, model_path: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlplace.train",
            "experiment=arithmetic_grpo",
            *TINY,
            f"model.path={model_path}",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated", "disaggregated"])
def test_grpo_runs_in_both_modes_and_writes_metrics_timeline_and_model(
    variant: str, model_path: Path, tmp_path: Path
) -> None:
    # Disaggregated: 4 micro-batches per step stream through the stages.
    experiment = [] if variant == "collocated" else ["experiment=arithmetic_grpo_disagg", "task.prompts_per_step=8"]
    result = train(tmp_path, model_path, *experiment)
    assert f"rlplace: done: {variant} placement, held-out accuracy" in result.stdout
    rows = metrics(tmp_path)
    assert len(rows) == 2
    for row in rows:
        for key in (
            "time/step",
            "time/sync_weights",
            "time/generate_rollouts",
            "time/rollout",
            "time/reward",
            "time/inference",
            "time/training",
            "throughput/tokens_per_s",
            "throughput/tokens_per_s_per_device",
            "throughput/generation_tokens_per_s",
            "rollout/response_length",
            "rollout/reward",
            "train/policy_loss",
            "train/kl",
            "train/clip_frac",
            "eval/accuracy",
        ):
            assert key in row, key
        assert 0 <= row["rollout/reward"] <= 1 and 0 < row["rollout/response_length"] <= 4
    spans = [
        {
            "name": e["name"],
            "group": e["args"]["group"],
            "rank": e["args"]["rank"],
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
        if e["ph"] == "X"
    ]
    assert {"rollout_generate", "reward", "inference", "training", "sync_weights"} <= {s["name"] for s in spans}
    if variant == "disaggregated":
        # The rollout generates micro-batch m+1 while the inference worker scores micro-batch m.
        timeline = Timeline({})
        timeline.extend(s for s in spans if s["name"] in ("rollout_generate", "inference"))
        assert timeline.overlap("rollout", "inference", 0.0, max(s["end"] for s in spans)) > 0
    trained = load_causal_lm(tmp_path / "final_model")
    assert trained.config.model_type == "llama"


@pytest.mark.slow
def test_vllm_backend_trains_and_its_weights_follow_the_actor(model_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    train(tmp_path, model_path, "experiment=arithmetic_grpo_disagg", "rollout=vllm", "rollout.max_new_tokens=4")
    rows = metrics(tmp_path)
    assert len(rows) == 2 and all("eval/accuracy" in row for row in rows)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.path=/nowhere"], "model.path = '/nowhere' is invalid: no such folder"),
        (["rollout.micro_batch_prompts=3"], "rollout.micro_batch_prompts = 3 must divide task.prompts_per_step = 4"),
        (["rollout.micro_batch_prompts=4"], "do not divide evenly over the 2 actor processes"),
        (["algorithm.group_size=1"], "algorithm.group_size = 1 is invalid"),
        (["rollout=policy"], "rollout.backend = 'policy' does not fit task.name = 'arithmetic'"),
        (["rollout.tensor_parallel_size=3"], "rollout.tensor_parallel_size = 3 does not divide"),
        (["experiment=arithmetic_grpo_disagg", "cluster.component_placement.reward=null"], "reward not placed"),
    ],
)
def test_bad_input_is_refused_before_workers_start(
    overrides: list[str], message: str, model_path: Path, tmp_path: Path
) -> None:
    result = train(tmp_path, model_path, *overrides, check=False)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
