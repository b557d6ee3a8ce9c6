"""Bad input to each command line, refused as the project's standard says: exit code 2 and one line (naming the key or
file, the value and what would be valid), no traceback, nothing started: no Ray, no worker, no run folder.

Most cases call the entry point in this process, with `sys.argv` as the command line would set it (each command
reads its arguments from there); a few run the installed command in a subprocess, where only the command line shows
what Hydra, logging or a slow import add, and bound its time.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

from rlplace import plan, train
from rlplace.cli import pretrain_main
from rlplace.core import checkpoint
from rlplace.metrics import wandb_unavailable
from rlplace.report.cli import main as report_main
from tests.planner.synthetic import write_profile
from tests.ray_temp import RAY_TEMP
from tests.test_report import CASES as BROKEN_SWEEPS
from tests.test_report import broken_sweeps

pytestmark = pytest.mark.usefixtures("no_ray")  # "no Ray started" means none in this process at all

ENTRY_POINTS: dict[str, Callable[[], None]] = {
    "rlplace-train": train.main,
    "rlplace-plan": plan.main,
    "rlplace-pretrain": pretrain_main,
    "rlplace-report": report_main,
}
REASONING = ["experiment=arithmetic_grpo"]
"""A reasoning run (rlplace-pretrain's task family); the default config is an embodied one."""


def checkpoint_folder(tmp: Path, manifest: str | None = None, state: object = None) -> Path:
    """A checkpoint as a run commits it (an actor file and the runner state `state`), its manifest then replaced by
    `manifest` when given."""
    staging = checkpoint.staging_dir(tmp / "old" / checkpoint.FOLDER, 1)
    (staging / "actor.pt").write_bytes(b"\0" * 64)
    (staging / checkpoint.STATE_FILE).write_text(json.dumps(state))
    folder = checkpoint.commit(staging)
    if manifest is not None:
        (folder / checkpoint.MANIFEST).write_text(manifest)
    return folder


def profile_folder(tmp: Path, **files: str) -> Path:
    """A profiled run folder (tests/planner/synthetic.py) with `files` (name -> text) written over its own."""
    folder = write_profile(tmp / "profiled")
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


DATASET = [*REASONING, "task=dataset", "task.prompt_key=question"]
GSM8K = [
    json.dumps({"question": f"Ava has {n} apples. How many?", "answer": f"She has {n}.\n#### {n}"}) for n in (3, 4)
]


def data(lines: list[str], *overrides: str) -> Callable[[Path], list[str]]:
    """A task=dataset run reading `lines` as its training file."""

    def write(tmp: Path) -> list[str]:
        (tmp / "train.jsonl").write_text("".join(line + "\n" for line in lines))
        return [*DATASET, f"task.train_path={tmp / 'train.jsonl'}", *overrides]

    return write


EMBODIED_STATE = {"family": "embodied", "step": 1, "identity": {}}
HEADER = json.dumps({"family": "embodied", "env_id": "CartPole-v1"})


def resume(manifest: str | None = None, state: object = EMBODIED_STATE) -> Callable[[Path], list[str]]:
    return lambda tmp: [f"runner.resume={checkpoint_folder(tmp, manifest, state)}"]


def profile(**files: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [f"plan.profile={profile_folder(tmp, **files)}"]


def report(case: str) -> Callable[[Path], list[str]]:
    return lambda tmp: [str(broken_sweeps(tmp)[case][0])]


REPORT_NAMES = {
    "missing": "nowhere is not a folder",
    "run folder": "holds no job folders (0, 1, ...): a run's folder, not a sweep's",
    "not a sweep": "other holds no job folders (0, 1, ...): not a sweep's folder",
    "no run.json": "0/run.json is missing",
    "empty metrics": "metrics.jsonl is empty: the job logged no step",
    "damaged metrics": "metrics.jsonl line 2 is not JSON",
    "bad run.json": "run.json is not a run's run.json",
}
"""What the refusal of each of `broken_sweeps` names (the folder or file, and what is wrong)."""


# command, arguments (or a function of the test's folder that makes the files they name), what the line names
CASES: dict[str, tuple[str, list[str] | Callable[[Path], list[str]], str]] = {
    # Hyperparameters out of range: every numeric field of every section is checked next to it.
    "max_grad_norm": ("rlplace-train", ["algorithm.max_grad_norm=-1"], "algorithm.max_grad_norm = -1.0 is invalid"),
    "gamma": ("rlplace-train", ["algorithm.gamma=2"], "algorithm.gamma = 2.0 is invalid: in [0, 1]"),
    "gae_lambda": ("rlplace-train", ["algorithm.gae_lambda=-1"], "algorithm.gae_lambda = -1.0 is invalid"),
    "clip_ratio_low": ("rlplace-train", ["algorithm.clip_ratio_low=-1"], "algorithm.clip_ratio_low = -1.0"),
    "clip_ratio_high": ("rlplace-plan", ["algorithm.clip_ratio_high=0"], "algorithm.clip_ratio_high = 0.0"),
    "ent_coef": ("rlplace-train", ["algorithm.ent_coef=-5"], "algorithm.ent_coef = -5.0 is invalid: 0 or more"),
    "vf_coef": ("rlplace-train", ["algorithm.vf_coef=-1"], "algorithm.vf_coef = -1.0 is invalid: 0 or more"),
    "lr": ("rlplace-plan", ["algorithm.lr=0"], "algorithm.lr = 0.0 is invalid: positive"),
    "lr nan": ("rlplace-plan", ["algorithm.lr=nan"], "algorithm.lr = nan is invalid: positive"),
    "update_epochs": ("rlplace-plan", ["algorithm.update_epochs=0"], "algorithm.update_epochs = 0"),
    "behaviour_weight_cap": ("rlplace-plan", ["algorithm.behaviour_weight_cap=0.5"], "algorithm.behaviour_weight_cap"),
    "max_episode_steps": ("rlplace-train", ["task.max_episode_steps=-1"], "task.max_episode_steps = -1 is invalid"),
    "total_num_envs": ("rlplace-plan", ["task.total_num_envs=0"], "task.total_num_envs = 0"),
    "num_steps": ("rlplace-plan", ["rollout.num_steps=0"], "rollout.num_steps = 0"),
    "pipeline_stage_num": ("rlplace-train", ["rollout.pipeline_stage_num=0"], "rollout.pipeline_stage_num = 0"),
    "hidden_sizes": ("rlplace-plan", ["model.hidden_sizes=[64,0]"], "model.hidden_sizes = [64, 0]"),
    "seed": ("rlplace-train", ["runner.seed=-1"], "runner.seed = -1 is invalid: 0 or more"),
    "max_steps": ("rlplace-train", ["runner.max_steps=0"], "runner.max_steps = 0 is invalid: at least 1"),
    "hang_timeout_s": ("rlplace-plan", ["runner.hang_timeout_s=0"], "runner.hang_timeout_s = 0.0"),
    "max_staleness": ("rlplace-plan", ["runner.max_staleness=-1"], "runner.max_staleness = -1"),
    "replace_at step": ("rlplace-train", ["runner.replace_at=[150:collocated]"], "runner.replace_at = ['150:"),
    "replace_at auto": ("rlplace-train", ["runner.replace_at=[2:auto]"], "runner.replace_at = 2:auto is invalid"),
    "replace_at unfit": (
        "rlplace-train",
        ["runner.replace_at=[2:reasoning_hybrid]"],  # a reasoning preset for an embodied run: no env placed
        "runner.replace_at = 2:reasoning_hybrid:",
    ),
    "replan without a profile": ("rlplace-train", ["runner.replan_interval=5"], "runner.replan_interval = 5 is"),
    "replan_margin": ("rlplace-train", ["runner.replan_margin=0"], "runner.replan_margin = 0.0 is invalid"),
    "replace_at preset": ("rlplace-train", ["runner.replace_at=[2:nowhere]"], "runner.replace_at = 2:nowhere: "),
    "connect_timeout_s": ("rlplace-train", ["cluster.connect_timeout_s=0"], "cluster.connect_timeout_s = 0.0"),
    "num_devices_per_node": ("rlplace-plan", ["cluster.num_devices_per_node=0"], "cluster.num_devices_per_node = 0 is"),
    "bucket_mb": ("rlplace-plan", ["weight_sync.bucket_mb=-1"], "weight_sync.bucket_mb = -1.0"),
    "device_memory_gb": ("rlplace-plan", ["cluster.device_memory_gb=0"], "cluster.device_memory_gb = 0.0 is invalid"),
    "plan.top": ("rlplace-plan", ["plan.top=0"], "plan.top = 0 is invalid: at least 1"),
    "reasoning gamma": ("rlplace-pretrain", [*REASONING, "algorithm.gamma=2"], "algorithm.gamma = 2.0 is invalid"),
    "critic_lr": ("rlplace-plan", [*REASONING, "algorithm.critic_lr=0"], "algorithm.critic_lr = 0.0 is invalid"),
    "kl_coef": ("rlplace-plan", [*REASONING, "algorithm.kl_coef=-1"], "algorithm.kl_coef = -1.0 is invalid"),
    "loss_agg": (
        "rlplace-plan",
        [*REASONING, "algorithm.loss_agg=sum"],
        "algorithm.loss_agg = 'sum' is invalid: valid",
    ),
    "lora sync without adapters": (
        "rlplace-plan",
        [*REASONING, "actor.lora.sync=adapters"],
        "actor.lora.sync = 'adapters' is invalid: merged without adapters (rank 0)",
    ),
    "lora rank vllm cannot apply": (
        "rlplace-plan",
        [*REASONING, "rollout=vllm", "actor.lora.rank=1024", "actor.lora.sync=adapters"],
        "actor.lora.rank = 1024 is invalid with actor.lora.sync = adapters: the vllm backend applies adapters of rank",
    ),
    "importance_ratio": ("rlplace-train", [*REASONING, "algorithm.importance_ratio=seq"], "token, sequence"),
    "max_epochs": ("rlplace-plan", ["runner.max_epochs=0"], "runner.max_epochs = 0 is invalid: null or at least 1"),
    "max_epochs embodied": ("rlplace-train", ["runner.max_epochs=2"], "runner.max_epochs = 2 is invalid for embodied"),
    "max_epochs arithmetic": (
        "rlplace-plan",
        [*REASONING, "runner.max_epochs=2"],
        "runner.max_epochs = 2 is invalid with task.name = 'arithmetic': its problems are made without end",
    ),
    "val_only embodied": ("rlplace-train", ["runner.val_only=true"], "runner.val_only = True is invalid: false for"),
    "val_only profile": (
        "rlplace-plan",
        [*REASONING, "runner.val_only=true", "runner.profile=true"],
        "runner.profile = True is invalid: unset with runner.val_only",
    ),
    "dual clip": ("rlplace-plan", [*REASONING, "algorithm.clip_ratio_c=1"], "algorithm.clip_ratio_c = 1.0 is invalid"),
    "adaptive kl in the loss": (
        "rlplace-train",
        [*REASONING, "algorithm.kl_coef=0.01", "algorithm.kl_ctrl=adaptive"],
        "algorithm.kl_ctrl = 'adaptive' is invalid: fixed; adaptive steers a KL in the reward",
    ),
    "std of rloo": (
        "rlplace-train",
        [*REASONING, "algorithm=rloo", "algorithm.norm_adv_by_std=false"],
        "algorithm.norm_adv_by_std = False is invalid: true with algorithm.name=rloo (only grpo divides",
    ),
    "temperature": ("rlplace-train", [*REASONING, "rollout.temperature=-1"], "rollout.temperature = -1.0"),
    "max_new_tokens": ("rlplace-plan", [*REASONING, "rollout.max_new_tokens=0"], "rollout.max_new_tokens = 0"),
    "actor strategy": ("rlplace-train", [*REASONING, "actor.strategy=zero3"], "actor.strategy = 'zero3' is invalid"),
    "actor dtype": ("rlplace-plan", [*REASONING, "actor.dtype=fp16"], "actor.dtype = 'fp16' is invalid: valid: fp32"),
    "bf16 replica": (
        "rlplace-train",
        [*REASONING, "actor.strategy=ddp", "actor.dtype=bf16"],
        "actor.dtype = 'bf16' is invalid: valid with actor.strategy=ddp: fp32",
    ),
    "token budget": (
        "rlplace-plan",
        [*REASONING, "actor.max_tokens_per_micro_batch=0"],
        "actor.max_tokens_per_micro_batch = 0 is invalid",
    ),
    "gpu_memory_utilization": (
        "rlplace-plan",
        [*REASONING, "rollout.gpu_memory_utilization=1.5"],
        "rollout.gpu_memory_utilization = 1.5 is invalid: in (0, 1]",
    ),
    "pretrain lr": ("rlplace-pretrain", [*REASONING, "model.pretrain.lr=0"], "model.pretrain.lr = 0.0 is invalid"),
    "pretrain seed": ("rlplace-pretrain", [*REASONING, "model.pretrain.seed=-1"], "model.pretrain.seed = -1"),
    "pretrain steps": ("rlplace-pretrain", [*REASONING, "model.pretrain.max_steps=0"], "model.pretrain.max_steps"),
    "target_accuracy": (
        "rlplace-pretrain",
        [*REASONING, "model.pretrain.target_accuracy=2"],
        "model.pretrain.target_accuracy = 2.0 is invalid: in (0, 1]",
    ),
    # Unknown keys, also added with `+`, in every section and every command.
    "+algorithm train": ("rlplace-train", ["+algorithm.grop_size=4"], "algorithm.grop_size = 4: PPOConfig has no"),
    "+model train": ("rlplace-train", ["+model.gradient_checkpointing=true"], "model.gradient_checkpointing = True"),
    "+task plan": ("rlplace-plan", ["+task.foo=1"], "task.foo = 1: EmbodiedTaskConfig has no key 'foo'"),
    "+rollout plan": ("rlplace-plan", ["+rollout.foo=1"], "rollout.foo = 1: PolicyRolloutConfig has no key"),
    "+cluster train": ("rlplace-train", ["+cluster.foo=1"], "cluster.foo = 1: ClusterConfig has no key 'foo'"),
    "+section plan": ("rlplace-plan", ["+foo=1"], "foo = 1: this embodied run has no foo section"),
    "+algorithm pretrain": ("rlplace-pretrain", [*REASONING, "+algorithm.grop_size=4"], "algorithm.grop_size = 4"),
    "+model pretrain": (
        "rlplace-pretrain",
        [*REASONING, "+model.gradient_checkpointing=true"],
        "model.gradient_checkpointing = True: LMConfig has no key",
    ),
    "+model.pretrain": ("rlplace-pretrain", [*REASONING, "+model.pretrain.foo=1"], "model.pretrain.foo = 1"),
    "+task reasoning": ("rlplace-train", [*REASONING, "+task.foo=1"], "task.foo = 1: ArithmeticTaskConfig has no"),
    "+rollout reasoning": ("rlplace-plan", [*REASONING, "+rollout.foo=1"], "rollout.foo = 1: GenerationConfig"),
    "key without +": ("rlplace-train", ["algorithm.grop_size=4"], "Could not override 'algorithm.grop_size'"),
    # What Hydra refuses while composing, and the command line itself.
    "unknown option": ("rlplace-train", ["placement=foo"], "Could not find 'placement/foo'"),
    "wrong type": ("rlplace-plan", ["runner.max_steps=abc"], "runner.max_steps=abc"),
    "pretrain option": ("rlplace-pretrain", ["model=nope"], "Could not find 'model/nope'"),
    "unquoted comma": (
        "rlplace-train",
        ["cluster.component_placement.actor=0,5"],
        """quote it: 'cluster.component_placement.actor="0,5"'""",
    ),
    "unquoted comma plan": ("rlplace-plan", ["cluster.component_placement.actor=0,5"], "only a multirun (-m) runs"),
    "quoted comma": (
        "rlplace-train",
        ['cluster.component_placement.actor="0,5"'],
        "cluster.component_placement.actor = '0,5': device 5 is out of range",
    ),
    "run dir in /proc": ("rlplace-train", ["hydra.run.dir=/proc/foo"], "hydra.run.dir = '/proc/foo': cannot write"),
    "run dir under a file": ("rlplace-train", ["hydra.run.dir=/dev/null/run"], "(/dev/null is not a folder)"),
    "not a reasoning task": ("rlplace-pretrain", [], "rlplace-pretrain pretrains the LM of a reasoning task"),
    "hf without path": ("rlplace-pretrain", [*REASONING, "model=hf"], "model.path = None is invalid"),
    # Checkpoints to resume: damaged metadata is named by file.
    "manifest of no sizes": ("rlplace-train", resume('{"actor.pt": {}}'), "manifest.json has 'actor.pt': {}"),
    "manifest a list": ("rlplace-train", resume("[]"), "manifest.json holds [], not a manifest of files"),
    "manifest not JSON": ("rlplace-train", resume("{"), "manifest.json is unreadable"),
    "state without identity": (
        "rlplace-train",
        resume(state={"family": "embodied", "step": 1}),
        "runner.json has identity = null, not dict",
    ),
    "state a list": ("rlplace-train", resume(state=[]), "not a checkpoint of the embodied family (no embodied state"),
    "state of the other family": (
        "rlplace-train",
        resume(state={"family": "reasoning", "step": 1, "identity": {}}),
        "not a checkpoint of the embodied family",
    ),
    "state without step": (
        "rlplace-train",
        resume(state={"family": "embodied", "identity": {}}),
        "runner.json has step = null, not int",
    ),
    "no such checkpoint": ("rlplace-train", ["runner.resume=/nonexistent/step_1"], "no such checkpoint folder"),
    "nothing to resume": (
        "rlplace-train",
        lambda tmp: ["runner.resume=auto", f"hydra.run.dir={tmp / 'run'}"],
        "runner.resume = 'auto': no checkpoint under",
    ),
    # Profiles to plan from: damaged files are named.
    "profile not JSON": ("rlplace-plan", profile(profile_json="garbage"), "profile.json cannot be used"),
    "profile a list": ("rlplace-plan", profile(profile_json="[]"), "profile.json holds list, not a profile"),
    "profile header only": ("rlplace-plan", profile(profile_json=HEADER), "the profile is incomplete (no 'env')"),
    "profile metrics garbage": ("rlplace-plan", profile(metrics_jsonl="garbage\n"), "metrics.jsonl cannot be used"),
    "profile metrics empty": ("rlplace-plan", profile(metrics_jsonl=""), "metrics.jsonl cannot be used (ValueError"),
    "profile metrics without step": ("rlplace-plan", profile(metrics_jsonl='{"a": 1}\n'), "(no 'step')"),
    "profile timeline garbage": ("rlplace-plan", profile(timeline_json='{"traceEvents": 5}'), "timeline.json"),
    "profile missing": ("rlplace-plan", ["plan.profile=/nonexistent"], "no profile.json there"),
    "profile of another family": (
        "rlplace-plan",
        lambda tmp: [*REASONING, *profile()(tmp)],
        "it profiled a run of 'CartPole-v1' (embodied family), not this reasoning run of 'arithmetic'",
    ),
    # Folders that are no sweep's.
    **{f"report {case}": ("rlplace-report", report(case), REPORT_NAMES[case]) for case in BROKEN_SWEEPS},
    "report no folder given": ("rlplace-report", [], "the following arguments are required: multirun_dir (usage:"),
    "report unknown flag": ("rlplace-report", ["--wandb", "x"], "unrecognized arguments: --wandb"),
    # A reasoning task's data, read and checked by the driver.
    "data line": (
        "rlplace-train",
        data(GSM8K + ['{"question": "q?"}']),
        'train.jsonl:3: no "answer" (task.answer_key)',
    ),
    "data key": ("rlplace-plan", data(GSM8K, "task.prompt_key=prompt"), 'train.jsonl:1: no "prompt" (task.prompt_key)'),
    "data json": ("rlplace-pretrain", data([*GSM8K, "{oops"]), "train.jsonl:3: not valid JSON"),
    "data eval size": ("rlplace-train", data(GSM8K * 3), "task.eval_size = 200 is invalid: at most 5 held-out"),
    "data missing": (
        "rlplace-train",
        [*DATASET, "task.train_path=/no/data.jsonl"],
        "'/no/data.jsonl' is invalid: no such",
    ),
    "data suffix": ("rlplace-train", [*DATASET, "task.train_path=/etc/hostname"], "the suffix must be one of .jsonl"),
    "generation rounds": ("rlplace-plan", [*REASONING, "algorithm.max_generation_rounds=0"], "algorithm.max_gen"),
    "chat template": ("rlplace-train", [*REASONING, "task.apply_chat_template=maybe"], "task.apply_chat_template"),
    "overlong buffer": (
        "rlplace-plan",
        [*REASONING, "reward.overlong_buffer=99"],
        "reward.overlong_buffer = 99 is invalid: at most rollout.max_new_tokens = 8",
    ),
    "tool": (
        "rlplace-plan",
        [*REASONING, "rollout.multi_turn.tool=calc"],
        "rollout.multi_turn.tool = 'calc' is invalid",
    ),
    "two tools of one name": (
        "rlplace-plan",
        [*REASONING, "rollout.multi_turn.tool=[calculator,calculator]"],
        "rollout.multi_turn.tool = ['calculator', 'calculator'] is invalid: two tools are named 'calculator'",
    ),
    "interaction": (
        "rlplace-train",
        [*REASONING, "rollout.multi_turn.interaction=retries"],
        "rollout.multi_turn.interaction = 'retries' is invalid: valid: retry",
    ),
    "feedback template": (
        "rlplace-plan",
        [*REASONING, "rollout.multi_turn.interaction=retry", "rollout.multi_turn.feedback_template=again"],
        "rollout.multi_turn.feedback_template = 'again' is invalid: a text holding {feedback}",
    ),
    "concurrent calls": (
        "rlplace-train",
        [*REASONING, "rollout.multi_turn.tool=calculator", "rollout.multi_turn.max_concurrent_calls=0"],
        "rollout.multi_turn.max_concurrent_calls = 0 is invalid: at least 1",
    ),
    "call timeout": (
        "rlplace-plan",
        [*REASONING, "rollout.multi_turn.interaction=retry", "rollout.multi_turn.call_timeout_s=0"],
        "rollout.multi_turn.call_timeout_s = 0.0 is invalid: positive seconds",
    ),
    "scoring budget": (
        "rlplace-plan",
        [*REASONING, "inference.max_tokens_per_micro_batch=0"],
        "inference.max_tokens_per_micro_batch = 0 is invalid: null or at least 1",
    ),
    "behaviour log-probs": (
        "rlplace-plan",
        [*REASONING, "algorithm.behaviour_logprobs=engine"],
        "algorithm.behaviour_logprobs = 'engine' is invalid: valid: inference, rollout",
    ),
    "top p": ("rlplace-plan", [*REASONING, "rollout.top_p=0"], "rollout.top_p = 0.0 is invalid: in (0, 1]"),
    "sampled greedy evaluation": ("rlplace-train", [*REASONING, "rollout.eval_samples=4"], "rollout.eval_samples = 4"),
    "data pattern": ("rlplace-train", [*DATASET, "task.train_path=/no/*.jsonl"], "'/no/*.jsonl' is invalid: no file"),
    # Clusters this machine cannot be, refused before Ray starts.
    "two nodes embedded": ("rlplace-train", ["cluster.num_nodes=2"], "cluster.num_nodes=2"),
    "more cores than the machine": (
        "rlplace-train",
        ["cluster.cpus_per_device=4096"],
        "cluster.cpus_per_device = 4096",
    ),
    "oversubscribed": ("rlplace-train", ["cluster.max_oversubscription=0.01"], "cluster.max_oversubscription = 0.01"),
    "more GPUs than the machine": (
        "rlplace-train",
        ["cluster.device_type=gpu", "cluster.num_devices_per_node=16", "placement=collocated"],
        "cluster.num_devices_per_node = 16 GPUs asked",
    ),
    "nothing at the address": (
        "rlplace-train",
        ["cluster.address=127.0.0.1:1", "cluster.connect_timeout_s=0.5"],
        "cluster.address = '127.0.0.1:1': could not attach to a Ray cluster: tried",
    ),
}


@pytest.fixture(scope="module")
def web_server() -> Iterator[int]:
    """A plain HTTP server (not Ray) on a free port of every interface: what answers at a mistyped cluster.address,
    such as Ray's dashboard port."""

    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def one_line_refusal(code: object, output: str) -> str:
    """The refusal's line, after checking that it is the whole output and that the command exited 2."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 2, output[-2000:]
    assert "Traceback" not in output and len(lines) == 1, output[-2000:]
    return lines[0]


def run_in_process(
    command: str, args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    """The command's one-line refusal, run here: its entry point with `sys.argv` as the command line sets it."""
    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", [command, *args])
    with pytest.raises(SystemExit) as exit_info:
        ENTRY_POINTS[command]()
    captured = capsys.readouterr()
    return one_line_refusal(exit_info.value.code, captured.out + captured.err)


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_in_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    command, args, names = CASES[name]
    args = args(tmp_path) if callable(args) else args
    run_dir = tmp_path / "run"
    if command == "rlplace-train" and not any(arg.startswith("hydra.run.dir=") for arg in args):
        args = [*args, f"hydra.run.dir={run_dir}"]
    line = run_in_process(command, args, monkeypatch, capsys)
    assert line.startswith("rlplace: error: ") and names in line, line
    assert command != "rlplace-train" or not run_dir.exists()  # Hydra made no run folder: nothing started
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_service_that_is_not_ray_at_the_address_is_refused_at_once(
    web_server: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    args = [f"cluster.address=127.0.0.1:{web_server}", "cluster.connect_timeout_s=5", f"hydra.run.dir={tmp_path}/run"]
    line = run_in_process("rlplace-train", args, monkeypatch, capsys)
    assert f"cluster.address = '127.0.0.1:{web_server}': could not attach to a Ray cluster: " in line
    assert "answers, but not as a Ray head" in line
    assert time.monotonic() - started < 5


def test_wandb_online_without_an_api_key_is_refused_before_ray_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs start their workers before their logger: a tracker that cannot log in is refused before either."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no wandb settings of this machine's user
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb"))
    run_dir = tmp_path / "run"
    line = run_in_process(
        "rlplace-train", ["logger.wandb.mode=online", f"hydra.run.dir={run_dir}"], monkeypatch, capsys
    )
    assert line == (
        "rlplace: error: logger.wandb.mode = 'online' is invalid here: no wandb API key is configured (set "
        "WANDB_API_KEY or run `wandb login`); valid without one: offline (upload later with `wandb sync`), disabled"
    )
    assert not run_dir.exists() and ("ray" not in sys.modules or not sys.modules["ray"].is_initialized())
    monkeypatch.setenv("WANDB_MODE", "offline")  # the environment overrides the config, as wandb.init does
    assert wandb_unavailable("online") is None
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_unavailable("offline") is None


def run_command(command: str, *args: str, wall_limit_s: float = 30.0) -> str:
    """The one-line refusal of the installed `command`, in a subprocess, without starting a Ray of its own (Ray names
    a session folder after the process that starts it), within `wall_limit_s` and `CPU_LIMIT_S` of CPU time.

    CPU time is what a refusal costs whatever else the machine runs: under the whole suite on 2 cores, a refusal that
    takes 1.3-1.7 s alone took 7-10 s of wall time; its CPU time stays put. The wall limit catches a wait (a refusal
    that would come only after a timeout)."""
    started, born = time.monotonic(), time.time()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / command), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = process.communicate(timeout=60)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    line = one_line_refusal(process.returncode, out + err)
    assert cpu < CPU_LIMIT_S, f"{command} took {cpu:.1f} s of CPU to refuse: {line}"
    assert elapsed < wall_limit_s, f"{command} took {elapsed:.1f} s to refuse: {line}"
    # A folder older than the process is an earlier process's with the same pid (pids are reused).
    assert not [p for p in RAY_TEMP.glob(f"session_*_{process.pid}") if p.stat().st_mtime >= born]
    return line


CPU_LIMIT_S = 5.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "args", "names"),
    [
        ("rlplace-train", ["algorithm.gamma=2"], "algorithm.gamma = 2.0 is invalid"),
        ("rlplace-train", ["cluster.component_placement.actor=0,5"], "'cluster.component_placement.actor=\"0,5\"'"),
        ("rlplace-train", ["hydra.run.dir=/proc/foo"], "hydra.run.dir = '/proc/foo'"),
        ("rlplace-plan", ["+algorithm.grop_size=4"], "algorithm.grop_size = 4"),
        ("rlplace-pretrain", [*REASONING, "model.pretrain.lr=0"], "model.pretrain.lr = 0.0 is invalid"),
        ("rlplace-report", ["/nonexistent"], "/nonexistent"),
        (
            "rlplace-train",
            [*DATASET, f"task.train_path={Path(__file__).parent / 'bad_record.jsonl'}"],
            ':2: no "answer"',
        ),
    ],
    ids=["train", "train unquoted comma", "train run dir", "plan", "pretrain", "report", "train bad record"],
)
def test_each_command_refuses_within_seconds(command: str, args: list[str], names: str) -> None:
    assert names in run_command(command, *args)


@pytest.mark.slow
def test_rlplace_train_refuses_a_service_that_is_not_ray_within_the_timeout(web_server: int, tmp_path: Path) -> None:
    address = f"127.0.0.1:{web_server}"
    args = [f"cluster.address={address}", "cluster.connect_timeout_s=5", f"hydra.run.dir={tmp_path}/run"]
    line = run_command("rlplace-train", *args, wall_limit_s=20)  # 5 s of waiting for an answer, then the refusal
    assert f"cluster.address = '{address}': could not attach to a Ray cluster" in line
    assert not (tmp_path / "run").exists()
