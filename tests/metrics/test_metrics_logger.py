"""Logger backends (jsonl, offline wandb, composition), build_logger's refusal, and summarize()."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.wandb_records import final_summary

from rlplace.metrics import JsonlLogger, NullLogger, TrackerRun, WandbLogger, build_logger, read_jsonl, summarize
from rlplace.metrics.logger import MetricLogger, MultiLogger


def test_jsonl_logger_writes_one_flushed_line_per_step(tmp_path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    logger = JsonlLogger(path)
    logger.log({"time/step": 1.5, "train/policy_loss": 2}, step=0)
    assert json.loads(path.read_text()) == {"step": 0, "time/step": 1.5, "train/policy_loss": 2.0}  # flushed
    logger.log({"time/step": 1.0}, step=1)
    logger.log_summary({"time/step": 1.25})
    logger.close()
    logger.close()  # idempotent
    assert read_jsonl(path) == [
        {"step": 0, "time/step": 1.5, "train/policy_loss": 2.0},
        {"step": 1, "time/step": 1.0},
    ]
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == {"time/step": 1.25}
    with pytest.raises(TypeError, match="'env/success'"):
        JsonlLogger(path).log({"env/success": "yes"}, step=2)


def test_jsonl_logger_of_a_resumed_run_drops_the_rows_written_after_its_checkpoint(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    first = JsonlLogger(path)
    for step in range(5):  # the first attempt got to step 4; its newest checkpoint is of step 3
        first.log({"train/loss": step}, step)
    first.close()
    resumed = JsonlLogger(path, start_step=3)
    for step in range(3, 6):
        resumed.log({"train/loss": 10 + step}, step)
    resumed.close()
    assert read_jsonl(path) == [{"step": s, "train/loss": float(s if s < 3 else 10 + s)} for s in range(6)]


def test_wandb_logger_offline_writes_a_local_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = {"cluster": {"component_placement": {"actor,rollout": "all"}}, "algorithm": {"lr": 3e-4}}
    logger = WandbLogger(
        project="rlplace-test", name="hybrid", group="sweep-1", tags=["hybrid", "test"], config=config, dir=tmp_path
    )
    assert logger.mode == "offline"
    assert logger.run.group == "sweep-1" and set(logger.run.tags) == {"hybrid", "test"}
    assert logger.run.config["algorithm"]["lr"] == 3e-4
    logger.log({"throughput/env_steps_per_s": 100.0}, step=0)
    logger.log({"throughput/env_steps_per_s": 120.0}, step=1)
    logger.log_summary({"throughput/env_steps_per_s": 110.0})
    assert logger.run.summary["throughput/env_steps_per_s"] == 110.0
    logger.close()
    logger.close()  # idempotent

    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb"))


CONSOLE_SCRIPT = """
import logging, sys
from rlplace.metrics import WandbLogger
handler = logging.StreamHandler(sys.stdout)  # bound to sys.stdout before wandb starts, as Hydra's console handler is
logging.getLogger("probe").addHandler(handler)
logger = WandbLogger(project="rlplace-test", dir=sys.argv[1])
print("printed to stdout")
print("printed to stderr", file=sys.stderr)
logging.getLogger("probe").warning("logged through a handler")
logger.close()
"""


def test_wandb_run_captures_the_console(tmp_path) -> None:
    # In a process of its own: pytest's capture of this process's stdout would be captured instead.
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_MODE": "offline"}
    subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, str(tmp_path)], env=env, check=True, timeout=60)
    (output,) = (tmp_path / "wandb").glob("offline-run-*/files/output.log")
    lines = output.read_text().splitlines()
    assert {"printed to stdout", "printed to stderr", "logged through a handler"} <= set(lines)


def test_every_start_in_a_run_folder_continues_one_wandb_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    ids = []
    for _ in range(2):  # a run, then its resumption in the same folder
        logger = build_logger("wandb", tmp_path, TrackerRun(config={}, project="rlplace-test"))
        ids.append(logger.loggers[1].run.id)
        logger.close()
    assert ids[0] == ids[1] == (tmp_path / "wandb_id.txt").read_text()
    offline_runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(ids[0] in p.name for p in offline_runs)  # `wandb sync` joins them


def test_build_logger_always_writes_jsonl(tmp_path) -> None:
    for backend in ("jsonl", "none"):
        logger = build_logger(backend, tmp_path / backend, TrackerRun(config={}))
        assert isinstance(logger, MetricLogger)
        logger.log({"time/step": 1.0}, step=0)
        logger.close()
        assert read_jsonl(tmp_path / backend / "metrics.jsonl") == [{"step": 0, "time/step": 1.0}]


def test_build_logger_refuses_unknown_backend(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"'tensorboard'.*\['wandb', 'jsonl', 'none'\]"):
        build_logger("tensorboard", tmp_path, TrackerRun(config={}))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_multi_logger_fans_out(tmp_path) -> None:
    logger = MultiLogger([JsonlLogger(tmp_path / "a.jsonl"), JsonlLogger(tmp_path / "b.jsonl"), NullLogger()])
    logger.log({"time/step": 2.0}, step=3)
    logger.close()
    assert read_jsonl(tmp_path / "a.jsonl") == read_jsonl(tmp_path / "b.jsonl") == [{"step": 3, "time/step": 2.0}]


def test_summarize_takes_medians_after_warmup() -> None:
    gen = "time/generate_rollouts"
    history = [
        {"step": 0, "time/step": 30.0, "throughput/tokens_per_s": 10.0, "train/policy_loss": 1.0, gen: 1.0},  # warm-up
        {"step": 1, "time/step": 2.0, "throughput/tokens_per_s": 100.0, gen: 1.0},
        {"step": 2, "time/step": 9.0, "throughput/tokens_per_s": 90.0, gen: 1.0},
        {"step": 3, "time/step": 3.0, "throughput/tokens_per_s": 110.0, "time/offload": 0.5, gen: 1.0},
        {"step": 4, "time/step": 4.0, "throughput/tokens_per_s": float("nan"), gen: 1.0},
        {"step": 5, "time/step": 1.0, "throughput/tokens_per_s": 0.0},  # an async run's last step: trains only
    ]
    # after 1 warm-up step: time/step median of [2, 9, 3, 4, 1] = 3; tokens/s median of [100, 90, 110] (NaN skipped,
    # step 5 generated nothing) = 100; time/generate_rollouts of steps 1-4 = 1; time/offload only at step 3 -> 0.5;
    # train/* not summarized
    assert summarize(history, warmup=1) == {
        "throughput/tokens_per_s": 100.0,
        "time/generate_rollouts": 1.0,
        "time/offload": 0.5,
        "time/step": 3.0,
    }
    assert summarize(history, warmup=6) == {}
    assert summarize(history, warmup=1, prefixes=("train/",)) == {}
    with pytest.raises(ValueError, match="warmup"):
        summarize(history, warmup=-1)


def test_wandb_summary_holds_summary_jsons_medians_when_the_last_step_generates_nothing(tmp_path, monkeypatch) -> None:
    """The last step of an asynchronous run only trains (a throughput of 0): the summary wandb keeps must still be
    the medians of summary.json, not the last row."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = build_logger("wandb", tmp_path, TrackerRun(config={}, project="rlplace-test", mode="offline"))
    for step, rate in enumerate([1.0, 1.0, 480.0, 494.0, 500.0, 510.0, 0.0]):
        generated = {"time/generate_rollouts": 0.5} if rate else {}  # the last step generates nothing
        logger.log({"throughput/tokens_per_s": rate, "time/step": 1.0 + step, "train/loss": -step, **generated}, step)
    logger.log_summary({**summarize(read_jsonl(tmp_path / "metrics.jsonl")), "final/accuracy": 0.5})
    logger.close()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["throughput/tokens_per_s"] == 497.0  # median of steps 2-5 (after warm-up, with generation)
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    recorded = final_summary(run)
    assert {key: recorded[key] for key in summary} == summary
    assert recorded["train/loss"] == -6  # metrics outside the summary keep their last value
    if (run / "files" / "wandb-summary.json").exists():  # a wandb that writes it offline: it must agree
        written = json.loads((run / "files" / "wandb-summary.json").read_text())
        assert {key: written[key] for key in summary} == summary
