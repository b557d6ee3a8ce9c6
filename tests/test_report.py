"""The sweep report: its numbers and sentences from made-up job folders (fast), then a tiny placement sweep end to
end: Hydra multirun with the report callback, skipped jobs, wandb in one group, and the same job on Hydra's Ray
launcher giving the same numbers.

One sweep (collocated, disaggregated, hybrid; 2 devices cannot hold disaggregated, so 2 jobs run) is shared by both
end-to-end tests: the report reads it, and its hybrid job is what the Ray launcher's one-job multirun, run at the
same time, must reproduce.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from hydra._internal.callbacks import Callbacks
from omegaconf import OmegaConf

from rlplace.metrics import Timeline
from rlplace.report import collect, write_report
from rlplace.report.charts import PHASE_COLOURS, phase_of
from rlplace.report.cli import main as report_main
from rlplace.report.collect import BUSIEST_STAGE, HANDOFF_WAIT, read_job
from rlplace.report.write import recommendation
from rlplace.train import RUN_INFO
from tests.planner.synthetic import profile_data, write_profile
from tests.ray_temp import RAY_TEMP, remove_sessions
from tests.train_here import train_here
from tests.wandb_records import final_summary, record_kinds

TINY = [
    "cluster=local",  # 2 devices, not the preset's 4: keeps a skipped job, and 2 runs instead of 3
    "rollout.pipeline_stage_num=2",  # narrows the sweep's params to one value
    "runner.max_staleness=0",  # and this one
    "task.total_num_envs=4",
    "rollout.num_steps=8",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=1",
    "runner.max_steps=2",
]
COMPARED = ("env/return_last20", "train/policy_loss", "train/value_loss", "train/entropy")


def fake_job(job_dir: Path, mode: str, rates: list[float], stages: int = 2) -> Path:
    """A job folder as a finished run leaves it, on 4 devices, with one step per rate: generation 0.6 s of a 1 s step,
    env busy 0.3 s and rollout 0.4 s of it (so the hand-off wait is 0.2 s)."""
    job_dir.mkdir()
    (job_dir / "run.json").write_text(json.dumps({"mode": mode, "num_devices": 4, "stages": stages}))
    step = {"time/step": 1.0, "time/generate_rollouts": 0.6, "time/env": 0.3, "time/rollout": 0.4}
    step |= {"time/training": 0.3, "util/device_0/busy_frac": 0.5}
    rows = [{"step": i, **step, "throughput/env_steps_per_s": rate} for i, rate in enumerate(rates)]
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    timeline = Timeline({("actor", 0): [0], ("env", 0): [0]}, num_devices=4, start=0.0)
    for name, group, start, end in (("step", "driver", 0.0, 1.0), ("env_step", "env", 0.1, 0.4)):
        timeline.add({"name": name, "group": group, "rank": 0, "start": start, "end": end})
    timeline.write(job_dir / "timeline.json")
    return job_dir


def test_an_asynchronous_job_leaves_out_its_last_steps_which_generate_nothing(tmp_path: Path) -> None:
    job_dir = fake_job(tmp_path / "0", "hybrid", [1.0, 1.0, 1250, 1300, 1350, 0.0])
    info = json.loads((job_dir / "run.json").read_text()) | {"staleness": 1}
    (job_dir / "run.json").write_text(json.dumps(info))
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    del rows[-1]["time/generate_rollouts"]  # K = 1: the last step only trains
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    job = read_job(job_dir)
    assert (job.n, job.median_throughput, job.title) == (3, 1300, "hybrid, 2 stages, K=1")


def test_a_job_is_measured_after_warm_up_with_its_hand_off_wait(tmp_path: Path) -> None:
    job = read_job(fake_job(tmp_path / "0", "hybrid", [1.0, 1.0, 1250, 1300, 1350, 1300, 1280]))
    assert (job.n, job.warmup, min(job.throughput), job.median_throughput) == (5, 2, 1250, 1300)
    assert job.medians[BUSIEST_STAGE] == pytest.approx(0.4) and job.medians[HANDOFF_WAIT] == pytest.approx(0.2)
    assert job.ideal_throughput == pytest.approx(1300 / 0.8)  # the step without its wait
    assert (job.title, job.unit, job.per_device) == ("hybrid, 2 stages", "env steps", 325)
    short = read_job(fake_job(tmp_path / "1", "hybrid", [500.0, 700.0]))
    assert (short.n, short.warmup) == (2, 0)  # too short to leave warm-up out: measured over all its steps


def test_report_states_n_spread_wait_per_device_and_a_recommendation(tmp_path: Path) -> None:
    fake_job(tmp_path / "0", "collocated", [1.0, 1.0, 950, 1000, 1050, 1000, 1000])
    fake_job(tmp_path / "1", "hybrid", [1.0, 1.0, 1250, 1300, 1350, 1300, 1300])
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "skipped.txt").write_text("needs 8 devices")
    report = write_report(tmp_path).read_text()
    header = "| job | mode | stages | K | devices | n | env steps/s | spread | ideal | vs collocated | per device/s |"
    assert header in report and "| env s | rollout s | wait s | train s | overlap s |" in report
    # n = 5 of 7 steps; ideal = 1300 / (1 s - 0.2 s of wait); 1300 / 4 devices x 3600 = 1.17M per device-hour
    assert (
        "| 1 | hybrid | 2 | 0 | 4 | 5 | 1300 | 1250-1350 | 1625 | 1.30x | 325 | 1.17M | 1.000 | 0.300 | 0.400 | 0.200"
        in report
    )
    assert "- job 2 (2): skipped: needs 8 devices" in report
    assert report.rstrip().splitlines()[-1] == (
        "**Recommendation:** fastest: hybrid, 2 stages (1,300 env steps/s), 1.30x over collocated, 2 stages on this "
        "cluster (4 devices)"
    )


def test_a_sweep_that_profiled_is_predicted_from_its_least_contended_job(tmp_path: Path) -> None:
    """`runner.profile=true` on a sweep: every job profiles itself, and the report predicts every job from the
    disaggregated one (the calibration point is that job's own run)."""
    jobs = [fake_job(tmp_path / "0", "collocated", [100.0] * 4), fake_job(tmp_path / "1", "disaggregated", [90.0] * 4)]
    for job in jobs:
        (job / "profile.json").write_text(json.dumps(profile_data()))
    results = collect(tmp_path)
    assert [r.predicted_from for r in results] == [str(jobs[1])] * 2
    assert all(r.predicted_step > 0 and r.prediction_error >= 0 for r in results)
    report = write_report(tmp_path).read_text()
    assert "| predicted s | error |" in report and f"from the profile of {jobs[1]}" in report


def test_an_adaptive_run_is_compared_with_a_fixed_one_on_its_whole_run(tmp_path: Path) -> None:
    """A job re-placed while it ran (`runner.replan_interval`, `runner.replace_at`) medians over its placements: the
    report names its moves and adds *run s*, every step and switch, to compare it with a fixed placement."""
    fake_job(tmp_path / "0", "hybrid", [1.0] * 6)
    adaptive = fake_job(tmp_path / "1", "hybrid", [1.0] * 6)
    info = json.loads((adaptive / "run.json").read_text())
    moved = [{"step": 2, "to": "disaggregated", "seconds": 3.5}]
    (adaptive / "run.json").write_text(json.dumps({**info, "replaced": moved}))
    results = collect(tmp_path)
    assert [r.run_s for r in results] == [pytest.approx(6.0), pytest.approx(9.5)]  # 6 steps of 1 s, and the switch
    assert results[1].title == "hybrid, 2 stages, re-placed after step 2"
    report = write_report(tmp_path).read_text()
    assert "| step s | run s |" in report and "| hybrid (re-placed) |" in report
    assert "- job 1 (1): re-placed after step 2 (disaggregated, 3.5 s): its medians mix its placements" in report


def test_recommendation_says_when_it_has_nothing_or_little_to_go_on(tmp_path: Path) -> None:
    one = read_job(fake_job(tmp_path / "0", "hybrid", [1.0, 1.0, 1300]))
    assert recommendation([one]).endswith("it is the only job that ran: nothing to compare it with")
    close = read_job(fake_job(tmp_path / "1", "hybrid", [1.0, 1.0, 1200, 1250, 1300], stages=1))
    assert recommendation([one, close]).endswith(
        "1.04x over hybrid, 1 stage on this cluster (4 devices); within the spread over steps, so not a clear win; "
        "only hybrid ran"
    )
    assert recommendation([]) == "no job ran: nothing to recommend"


def test_one_colour_per_phase_across_metrics_segments_and_spans() -> None:
    assert phase_of("time/training") == phase_of("training") == "training"
    assert phase_of("env_step") == phase_of("time/env") == "env"
    assert phase_of("time/busiest_stage") == phase_of("generate_rollouts") != phase_of("time/handoff_wait")
    assert phase_of("no_such_span") == "other"
    assert len(set(PHASE_COLOURS.values())) == len(PHASE_COLOURS)


def start_multirun(sweep_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    """`sweep=placement_modes` on the tiny settings, with `overrides`, as a command in a process of its own."""
    command = [sys.executable, "-m", "rlplace.train", "sweep=placement_modes", *TINY, f"hydra.sweep.dir={sweep_dir}"]
    env = {**os.environ, "RLPLACE_OUTPUT_DIR": f"{sweep_dir}-outputs"}  # where a pretrained model is cached
    return subprocess.Popen(
        [*command, *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )


RAY_SLOW_START = "The current node timed out during startup"
"""Ray's own error when a node it starts does not register within its fixed 30 s (`ray._private.node`)."""


@dataclass
class Multirun:
    """A multirun started by `start_multirun` in `sweep_dir` with `overrides`."""

    sweep_dir: Path
    overrides: tuple[str, ...]
    process: subprocess.Popen[str]

    def finish(self) -> str:
        """Wait for the multirun; its stdout. A Ray launcher's Ray that timed out starting (a loaded 2-core machine,
        where the basic sweep starts its own Ray and workers beside it, can take Ray past its 30 s) is started once
        more, alone: what is tested is the launcher's results, not Ray's start-up under that load."""
        stdout, stderr = self.process.communicate(timeout=600)
        if self.process.returncode != 0 and RAY_SLOW_START in stderr:
            with suppress(ProcessLookupError):  # what the failed start left running in the multirun's session
                os.killpg(self.process.pid, signal.SIGKILL)
            remove_sessions(self.process.pid)
            shutil.rmtree(self.sweep_dir)
            self.process = start_multirun(self.sweep_dir, *self.overrides)
            stdout, stderr = self.process.communicate(timeout=600)
        assert self.process.returncode == 0, stdout[-3000:] + stderr[-3000:]
        return stdout


def metrics(job_dir: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def ray_multirun(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Multirun]:
    """The Ray launcher's one-job multirun, disaggregated on 4 devices, started as a command on a Ray of its own (on
    a small machine much of it is waiting, for Ray and workers to start, which this process's sweep fills): what
    the basic launcher's hybrid job must reproduce."""
    ray_dir = tmp_path_factory.mktemp("ray")
    overrides = (
        "cluster=local4",
        "placement=disaggregated",
        "logger=jsonl",
        "hydra/launcher=ray",
        "+hydra.launcher.ray.init.num_cpus=2",
        "+hydra.launcher.ray.init.include_dashboard=false",  # its processes would leave /tmp/pymp-* behind
        # A Ray of its own: with address None, ray.init would join whatever Ray another test started last.
        "hydra.launcher.ray.init.address=local",
    )
    multirun = Multirun(ray_dir, overrides, start_multirun(ray_dir, *overrides))
    yield multirun
    process = multirun.process
    if process.poll() is None:  # a test that failed early leaves no multirun behind
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    remove_sessions(process.pid)  # the Ray launcher's Ray, started in the multirun's process


@pytest.fixture(scope="module")
def sweep(shared_ray: None, ray_multirun: Multirun, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The basic launcher's sweep, which feeds the report, run in this process (`train_here`) while the Ray
    launcher's multirun runs: its folder and stdout."""
    sweep_dir = tmp_path_factory.mktemp("basic")
    profile = write_profile(tmp_path_factory.mktemp("profile") / "run")  # the report predicts each job from it
    overrides = ["placement=collocated,disaggregated,hybrid", "logger=wandb", f"plan.profile={profile}"]
    output = train_here(
        "sweep=placement_modes",
        *TINY,
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
        env={"RLPLACE_OUTPUT_DIR": f"{sweep_dir}-outputs"},
    )
    return sweep_dir, output.stdout


@pytest.mark.slow
def test_tiny_sweep_writes_report_charts_and_one_wandb_run_per_job(sweep: tuple[Path, str]) -> None:
    sweep_dir, stdout = sweep
    assert "skipping job 1" in stdout  # disaggregated needs 4 devices; cluster=local has 2
    report = (sweep_dir / "report.md").read_text()
    # 2 steps leave none after warm-up: n = 2, starred as measured over all steps
    assert "| 0 | collocated | 2 | 0 | 2 | 2* |" in report and "| 2 | hybrid | 2 | 0 | 2 | 2* |" in report
    assert "- job 1 (placement=disaggregated rollout.pipeline_stage_num=2 runner.max_staleness=0): skipped:" in report
    assert report.rstrip().splitlines()[-1].startswith("**Recommendation:** fastest: ")
    assert "(2 devices)" in report.rstrip().splitlines()[-1]
    for png in ("throughput", "speedup", "time_breakdown", "utilization", "timeline_0", "timeline_2"):
        assert (sweep_dir / f"{png}.png").stat().st_size > 1000, png
    jobs = collect(sweep_dir)
    assert [j.skipped is not None for j in jobs] == [False, True, False]
    assert [j.mode for j in jobs] == ["collocated", "", "hybrid"]
    assert jobs[2].median_throughput > 0
    assert "| predicted s | error |" in report and jobs[0].predicted_step > 0 and jobs[2].prediction_error >= 0
    assert all(job.medians[HANDOFF_WAIT] >= 0 for job in (jobs[0], jobs[2]))
    rows = {  # each trace row names the components on it, in placement config order
        "0": ["device 0: actor, env, rollout", "device 1: actor, env, rollout", "host: driver"],
        "2": ["device 0: actor, env", "device 1: actor, rollout", "host: driver"],
    }
    for job, names in rows.items():
        trace = sweep_dir / job / "timeline.json"
        assert stat.S_IMODE(trace.stat().st_mode) == 0o644
        events = json.loads(trace.read_text())["traceEvents"]
        assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == names
    runs = sorted(sweep_dir.glob("*/wandb/offline-run-*"))
    assert len(runs) == 2
    for run in runs:  # the run record in the offline log carries the sweep's group and the mode tag
        log = next(run.glob("*.wandb")).read_bytes()
        assert b"placement_modes" in log and b"stages2" in log


@pytest.mark.slow
def test_neither_the_launcher_nor_the_placement_changes_results(
    sweep: tuple[Path, str], ray_multirun: Multirun
) -> None:
    # The basic launcher's hybrid job on 2 devices, and the Ray launcher's disaggregated job on 4: both train with 2
    # actor ranks, so to the last bit.
    basic = metrics(sweep[0] / "2")
    ray_multirun.finish()
    ray_dir = ray_multirun.sweep_dir
    assert not list(RAY_TEMP.glob(f"session_*_{ray_multirun.process.pid}")), "the Ray launcher's Ray left its session"
    on_ray = metrics(ray_dir / "0")
    assert json.loads((ray_dir / "0" / RUN_INFO).read_text())["mode"] == "disaggregated"
    assert len(on_ray) == len(basic) == 2
    for key in COMPARED:
        assert [row[key] for row in on_ray] == [row[key] for row in basic], key


def drop_generation(job_dir: Path, last: int, staleness: int = 1) -> Path:
    """Make `job_dir` an asynchronous run (runner.max_staleness = K) whose last `last` steps only train."""
    info = json.loads((job_dir / "run.json").read_text()) | {"staleness": staleness}
    (job_dir / "run.json").write_text(json.dumps(info))
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows[len(rows) - last :]:
        del row["time/generate_rollouts"]
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return job_dir


def test_a_job_too_short_to_measure_after_warm_up_is_reported_with_its_n_and_a_note(tmp_path: Path) -> None:
    """A 3-step run with runner.max_staleness=1: its last step generates nothing, which left no step after warm-up
    (the report crashed on it). It is measured over the steps that generated, starred, with a note."""
    fake_job(tmp_path / "0", "collocated", [1.0, 1.0, 950, 1000, 1050])
    drop_generation(fake_job(tmp_path / "1", "hybrid", [500.0, 700.0, 0.0]), last=1)
    drop_generation(fake_job(tmp_path / "2", "hybrid", [0.0, 0.0]), last=2)  # nothing generated at all
    short, empty = read_job(tmp_path / "1"), read_job(tmp_path / "2")
    assert (short.n, short.warmup, short.median_throughput) == (2, 0, 600)
    assert "none generating after the 2 warm-up steps" in short.note and "the 2 that generated" in short.note
    assert (empty.n, empty.note) == (0, "2 steps, none of which generated: nothing to measure")
    report = write_report(tmp_path).read_text()
    assert "| 1 | hybrid | 2 | 1 | 4 | 2* | 600 | 500-700 |" in report
    assert "| 2 | hybrid | 2 | 1 | 4 | 0 | - | - | - | n/a | - | - |" in report
    assert f"- job 1 (1): {short.note}" in report and f"- job 2 (2): {empty.note}" in report
    assert "nan" not in report
    assert "fastest: collocated, 2 stages (1,000 env steps/s)" in report  # the unmeasured job takes no part


def test_without_a_collocated_job_vs_collocated_says_n_a(tmp_path: Path) -> None:
    fake_job(tmp_path / "0", "hybrid", [1.0, 1.0, 1250, 1300, 1350])
    fake_job(tmp_path / "1", "disaggregated", [1.0, 1.0, 900, 1000, 1100])
    report = write_report(tmp_path).read_text()
    assert "| n/a |" in report and "nan" not in report


def broken_sweeps(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Folders the report cannot be made from, each with what its one-line refusal must say."""
    cases: dict[str, tuple[Path, str]] = {}
    cases["missing"] = (tmp_path / "nowhere", "is not a folder")
    run = fake_job(tmp_path / "run", "hybrid", [1.0, 2.0])
    cases["run folder"] = (run, "holds no job folders (0, 1, ...): a run's folder, not a sweep's")
    (tmp_path / "other").mkdir()
    cases["not a sweep"] = (tmp_path / "other", "not a sweep's folder")
    no_info = tmp_path / "no_info"
    no_info.mkdir()
    (fake_job(no_info / "0", "hybrid", [1.0, 2.0]) / "run.json").unlink()
    cases["no run.json"] = (no_info, "job 0: " + str(no_info / "0" / "run.json") + " is missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    (fake_job(empty / "0", "hybrid", [1.0, 2.0]) / "metrics.jsonl").write_text("")
    cases["empty metrics"] = (empty, "metrics.jsonl is empty: the job logged no step")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (fake_job(damaged / "0", "hybrid", [1.0, 2.0]) / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "ti')
    cases["damaged metrics"] = (damaged, "metrics.jsonl line 2 is not JSON")
    bad_info = tmp_path / "bad_info"
    bad_info.mkdir()
    (fake_job(bad_info / "0", "hybrid", [1.0, 2.0]) / "run.json").write_text("[]")
    cases["bad run.json"] = (bad_info, "run.json is not a run's run.json")
    return cases


CASES = ["missing", "run folder", "not a sweep", "no run.json", "empty metrics", "damaged metrics", "bad run.json"]


@pytest.mark.parametrize("case", CASES)
def test_rlplace_report_refuses_what_is_no_sweep_with_one_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, expected = broken_sweeps(tmp_path)[case]
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(folder)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("rlplace: error: ") and expected in err, err


def test_a_sweep_whose_report_cannot_be_written_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through Hydra's own callback runner, which turns an exception in a callback into a warning (the multirun
    then exited 0 without a report)."""
    folder, _ = broken_sweeps(tmp_path)["empty metrics"]
    callbacks = {"report": {"_target_": "rlplace.report.callback.ReportCallback"}}
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(folder)}, "callbacks": callbacks}})
    with pytest.raises(SystemExit) as exit_info:
        Callbacks(config).on_multirun_end(config=config)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"rlplace: error: the sweep report of {folder} could not be written: job 0: ")


def test_the_report_of_a_wandb_sweep_is_logged_to_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sweep_dir = tmp_path / "2030-01-02" / "03-04-05-678901"
    sweep_dir.mkdir(parents=True)
    fake_job(sweep_dir / "0", "collocated", [1.0, 1.0, 950, 1000, 1050])
    fake_job(sweep_dir / "1", "hybrid", [1.0, 1.0, 1250, 1300, 1350])
    multirun = {
        "hydra": {"runtime": {"choices": {"sweep": "placement_modes"}}, "sweeper": {"params": {"placement": "a,b"}}},
        "logger": {"backend": "wandb", "wandb": {"project": "rlplace-test", "mode": "offline", "group": None}},
    }
    (sweep_dir / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    for _ in range(2):  # written again (rlplace-report after the sweep's callback): the same wandb run continues
        report_main([str(sweep_dir)])
    assert "rlplace: sweep report on wandb in " in capsys.readouterr().out
    runs = sorted((sweep_dir / "wandb").glob("offline-run-*"))
    # offline-run-<time>-<run id>, with "-1" appended to the second when both started within the same second
    assert len(runs) == 2 and len({run.name.split("-")[3] for run in runs}) == 1
    kinds = record_kinds(runs[-1])
    assert "artifact" in kinds and "history" in kinds
    log = next(runs[-1].glob("*.wandb")).read_bytes()
    group = b"placement_modes-2030-01-02-03-04-05-678901"
    assert group in log and b"report" in log and b"report.md" in log and b"timeline_1.json" in log
    assert b"charts/throughput" in log and b"report/table" in log
    summary = final_summary(runs[-1])
    assert summary["report/fastest_job"] == "1" and summary["report/recommendation"].startswith("fastest: hybrid")
