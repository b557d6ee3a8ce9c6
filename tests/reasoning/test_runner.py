"""The reasoning loop end to end, as users run it: `rlplace-train experiment=arithmetic_grpo...` in a subprocess on
an embedded local Ray, from a tiny LM folder built here (not pretrained: these tests are about behaviour, not
accuracy; the accuracy gain is measured by the experiment itself and recorded in README).

Two runs cover the end-to-end tests, started together so that they share the machine's cores (almost all of a run's
time is its worker processes starting up, one group after the other): the collocated preset on one device, and the
disaggregated preset with two data-parallel actor ranks, generating with vLLM where it is installed. Config and
placement refusals are checked in-process through `resolve`, as both CLIs do, and one of them through the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from rlplace.cli import EXIT_BAD_CONFIG
from rlplace.core.errors import ConfigError
from rlplace.families import resolve
from rlplace.metrics import Timeline
from rlplace.placement import PlacementError
from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm, load_causal_lm

VLLM = importlib.util.find_spec("vllm") is not None
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
RUNS = {
    # Every component on one device (of one core), taking turns: the actor and rollout offload while the others work.
    "collocated": ["experiment=arithmetic_grpo", "cluster.num_devices_per_node=1", "cluster.cpus_per_device=1"],
    # Each stage on its own device, 16 micro-batches of 8-token responses per step streaming through them (enough
    # for the stages to overlap even when generation is quick), routed over 2 actor ranks that average their
    # gradients; generation with vLLM (hf without vLLM).
    "disaggregated": [
        "experiment=arithmetic_grpo_disagg",
        "task.prompts_per_step=16",
        "rollout.micro_batch_prompts=1",
        "rollout.max_new_tokens=8",
        "cluster.component_placement.actor=1:0-1",
        *(["rollout=vllm"] if VLLM else []),
    ],
}
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))


def command(run_dir: Path, model_path: Path, *overrides: str) -> list[str]:
    """`rlplace-train` on the tiny settings; `overrides` come last (a later `experiment=` replaces the first)."""
    return [
        sys.executable,
        "-m",
        "rlplace.train",
        "experiment=arithmetic_grpo",
        *TINY,
        f"model.path={model_path}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


@dataclass
class Run:
    """A training subprocess writing its output into its run folder."""

    run_dir: Path
    process: subprocess.Popen[bytes]
    stdout: str = ""
    stderr: str = ""

    def finished(self) -> Run:
        """Wait for it; it must have succeeded."""
        if self.process.returncode is None:
            try:
                self.process.wait(timeout=TIMEOUT_S)
            finally:
                self.stop()  # no-op once it exited
            self.stdout = (self.run_dir / "stdout.txt").read_text()
            self.stderr = (self.run_dir / "stderr.txt").read_text()
        assert self.process.returncode == 0, self.stdout[-3000:] + self.stderr[-3000:]
        return self

    def stop(self) -> None:
        """Interrupt it if it still runs, so that it shuts its Ray down (a kill would leave Ray's processes)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def metrics(self) -> list[dict[str, float]]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]


def selected_variants(session: pytest.Session) -> set[str]:
    """The runs that the selected tests read: a test's `variant` parameter, else (the vLLM test) disaggregated."""
    variants = set()
    for item in session.items:
        if "runs" in getattr(item, "fixturenames", ()):
            params = item.callspec.params if hasattr(item, "callspec") else {}
            variants.add(params.get("variant", "disaggregated"))
    return variants


@pytest.fixture(scope="module")
def runs(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, Run]]:
    """The runs the selected tests read, started at once on first use; a test waits for the one it checks."""
    started = {}
    wanted = selected_variants(request.session)
    for variant, overrides in RUNS.items():
        if variant not in wanted:
            continue
        run_dir = tmp_path_factory.mktemp(variant)
        with (run_dir / "stdout.txt").open("wb") as out, (run_dir / "stderr.txt").open("wb") as err:
            process = subprocess.Popen(command(run_dir, model_path, *overrides), stdout=out, stderr=err)
        started[variant] = Run(run_dir, process)
    yield started
    for run in started.values():
        run.stop()


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["collocated", "disaggregated"])
def test_grpo_runs_in_both_modes_and_writes_metrics_timeline_and_model(variant: str, runs: dict[str, Run]) -> None:
    run = runs[variant].finished()
    assert f"rlplace: done: {variant} placement, held-out accuracy" in run.stdout
    rows = run.metrics()
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
        assert 0 <= row["rollout/reward"] <= 1 and 0 < row["rollout/response_length"] <= 8
    spans = [
        {
            "name": e["name"],
            "group": e["args"]["group"],
            "rank": e["args"]["rank"],
            "start": e["ts"] / 1e6,
            "end": (e["ts"] + e["dur"]) / 1e6,
        }
        for e in json.loads((run.run_dir / "timeline.json").read_text())["traceEvents"]
        if e["ph"] == "X"
    ]
    assert {"rollout_generate", "reward", "inference", "training", "sync_weights"} <= {s["name"] for s in spans}
    if variant == "disaggregated":
        # Both actor ranks trained; the rollout generates micro-batch m+1 while the inference worker scores m.
        assert {s["rank"] for s in spans if s["group"] == "actor" and s["name"] == "training"} == {0, 1}
        timeline = Timeline({})
        timeline.extend(s for s in spans if s["name"] in ("rollout_generate", "inference"))
        assert timeline.overlap("rollout", "inference", 0.0, max(s["end"] for s in spans)) > 0
    trained = load_causal_lm(run.run_dir / "final_model")
    assert trained.config.model_type == "llama"


@pytest.mark.slow
def test_vllm_backend_trains_and_its_weights_follow_the_actor(runs: dict[str, Run]) -> None:
    # The disaggregated run generates with vLLM: the rollout checks the weight version it is asked for every step
    # (StaleWeightsError otherwise), so a finished run means the engine's weights followed the actor's.
    pytest.importorskip("vllm")
    run = runs["disaggregated"].finished()
    assert "backend: vllm" in (run.run_dir / ".hydra" / "config.yaml").read_text()
    rows = run.metrics()
    assert len(rows) == 2 and all("eval/accuracy" in row for row in rows)


ARITHMETIC_GROUPS = ["task=arithmetic", "model=tiny_lm", "placement=reasoning_collocated"]
"""A reasoning run chosen group by group instead of through the experiment preset."""


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (["model.path=/nowhere"], ConfigError, "model.path = '/nowhere' is invalid: no such folder"),
        (
            ["rollout.micro_batch_prompts=3"],
            ConfigError,
            "rollout.micro_batch_prompts = 3 must divide task.prompts_per_step = 4",
        ),
        (["rollout.micro_batch_prompts=4"], ConfigError, "do not divide evenly over the 2 actor processes"),
        (["algorithm.group_size=1"], ConfigError, "algorithm.group_size = 1 is invalid"),
        (["algorithm.num_minibatches=9"], ConfigError, "algorithm.num_minibatches = 9 is more than each actor's 8"),
        # Options of the other (embodied) family, naming the section and the valid reasoning options.
        (
            [*ARITHMETIC_GROUPS, "algorithm=grpo", "rollout=policy"],
            ConfigError,
            r"rollout: the chosen option \(rollout.backend = 'policy'\) belongs to the embodied family, but "
            r"task.name = 'arithmetic' is of the reasoning family \(valid: rollout=hf, rollout=vllm\)",
        ),
        (
            [*ARITHMETIC_GROUPS, "algorithm=ppo", "rollout=hf"],
            ConfigError,
            r"algorithm: the chosen option \(algorithm.name = 'ppo'\) belongs to the embodied family.*"
            r"valid: algorithm=grpo, algorithm=reasoning_ppo, algorithm=reinforce_pp",
        ),
        # Tensor parallelism is gone: its key no longer composes.
        (
            ["rollout.tensor_parallel_size=3"],
            ConfigCompositionException,
            "Could not override 'rollout.tensor_parallel_size'",
        ),
        (
            ["experiment=arithmetic_grpo_disagg", "cluster.component_placement.reward=null"],
            PlacementError,
            "reward not placed",
        ),
        (
            ["experiment=arithmetic_grpo_disagg", "cluster.num_devices_per_node=2"],
            ConfigError,
            r"cluster.component_placement.rollout: this placement preset asks for devices \[0, 1/4\)",
        ),
    ],
)
def test_bad_input_is_refused_before_workers_start(
    overrides: list[str], error: type[Exception], message: str, model_path: Path, compose_cfg
) -> None:
    if not overrides[0].startswith("task="):  # else the options are chosen group by group, as they are
        overrides = ["experiment=arithmetic_grpo", *TINY, f"model.path={model_path}", *overrides]
    with pytest.raises(error, match=message):
        resolve(compose_cfg(*overrides))


def test_cli_refuses_bad_input_with_exit_code_2_and_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        command(tmp_path, Path("/nowhere")), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == EXIT_BAD_CONFIG, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == ["rlplace: error: model.path = '/nowhere' is invalid: no such folder"]
    assert not (tmp_path / "metrics.jsonl").exists()
