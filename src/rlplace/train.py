"""`rlplace-train`: the Hydra entry point. Compose -> typed config -> placement -> the family's launcher.

A config or placement that cannot run is refused here, with one line naming the key and value and exit code 2,
before Ray or any worker starts. The return value is the sweep objective (env steps/s for embodied runs, held-out
accuracy for reasoning runs) for Hydra's sweepers.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from rlplace.cli import check_overrides, compose_run, fail, import_from_start_directory
from rlplace.core import checkpoint, preemption
from rlplace.core.config import CONF_DIR
from rlplace.core.errors import ConfigError
from rlplace.core.launcher import Launcher, RunContext
from rlplace.core.neighbours import describe, other_embedded_rays
from rlplace.families import Plan, family_of, register, resolve
from rlplace.metrics import (
    MetricLogger,
    Span,
    Timeline,
    TrackerRun,
    build_logger,
    process_uptime_s,
    summarize,
    wandb_unavailable,
)
from rlplace.placement import Placement, PlacementError
from rlplace.replace import Schedule, Switch, switches
from rlplace.scheduler import ClusterError

register()

SKIPPED = "skipped.txt"
"""Written in place of a run by a multirun job whose combination cannot run (with the reason)."""
log = logging.getLogger("rlplace")
"""The run's messages: on the console and, through Hydra's job logging, in the run folder's train.log."""
RUN_INFO = "run.json"
"""What the sweep report needs to label a run: its mode, device budget, and the family's labels (stages)."""
SUMMARY_PREFIXES = ("final/", "eval/", "run/")
"""The keys of the launcher's final metrics that go into the run's summary, besides the medians of `summarize`."""


def train(
    plan: Plan,
    run_dir: Path,
    resolved_config: dict,
    started: float | None = None,
    switches: Sequence[Switch] = (),
    keep_ray: bool = False,
) -> tuple[dict[str, float], Plan]:
    """Check the checkpoint to resume, start the cluster, then the family's groups and, while they start, the logger;
    then run the family's loop (`core.runner.Runner`), re-placed at each of `switches` (`runner.replace_at`) and
    wherever the planner moves it (`runner.replan_interval`: `rlplace.replace.Schedule`).

    Raises ConfigError for a checkpoint that cannot resume this run or a tracker that cannot log in, and
    ClusterError for a cluster that cannot hold it, all before any worker starts. SIGTERM or Ctrl-C during the run
    end it after the current step, with a checkpoint (`preemption`). `keep_ray`: an embedded Ray the run starts stays
    up for this process's next run (a multirun's next job) and stops at its exit. `started` is the
    `time.monotonic()` reading `run/startup_s` counts from (None: now); `run/teardown_s` counts from the loop's end
    until the workers and Ray are stopped. Returns the final metrics and the plan the run ended in (`plan`, unless
    it was re-placed).
    """
    from rlplace.scheduler import Cluster, check_start  # Ray loads when a run starts: `--help` stays quick

    started = time.monotonic() if started is None else started
    cfg, mode = plan.cfg, plan.placement.mode
    family = _import_launcher(plan)
    resume = checkpoint.resolve_resume(cfg.runner.resume, run_dir / checkpoint.FOLDER)
    if resume is not None:
        family.result().check_checkpoint(cfg, resume)
    cfg.runner.resume = None if resume is None else str(resume)  # `auto` resolved once, here, for every worker
    check_tracker(cfg)
    if plan.ranking is not None:
        log_ranking(plan.ranking, cfg.plan.top)
    log.info(f"rlplace: {mode} {plan.family.name} run of {cfg.task.name} ({sharing(plan)}); outputs in {run_dir}")
    if cfg.runner.max_epochs is not None:
        log.info(f"rlplace: runner.max_epochs = {cfg.runner.max_epochs}: {cfg.runner.max_steps} steps")
    if cfg.cluster.address is None and (neighbours := describe(other_embedded_rays())):
        log.warning(neighbours)
    history: list[dict[str, float]] = []
    logger: MetricLogger | None = None
    pending = [s for s in switches if resume is None or s.step > checkpoint.step_of(resume)]
    for switch in pending:  # each placement must fit the cluster before the first one starts
        check_start(switch.plan.cfg.cluster, processes(switch.plan))
    schedule = Schedule(plan, pending, history, run_dir)
    try:
        with (
            Cluster(
                cfg.cluster, call_timeout_s=cfg.runner.hang_timeout_s, placements=processes(plan), keep_ray=keep_ray
            ) as cluster,
            preemption.handled(),
        ):
            launcher = family.result()
            labels = launcher.run_labels(cfg)
            info = {"mode": mode, "num_devices": plan.placement.num_devices, **labels}
            if plan.ranking is not None:
                info["auto"] = {"overrides": plan.ranking[0].overrides, "predicted_step_s": plan.prediction.step_s}
            (run_dir / RUN_INFO).write_text(json.dumps(info))
            timeline, switch, switched, replaced, carried = None, None, 0.0, [], None
            while True:  # one pass per placement the run goes through (`runner.replace_at`, `replan_interval`)
                current = schedule.current
                starting = launcher.start(current.cfg, cluster)  # the workers start, and meanwhile the logger
                if logger is None:
                    logger = run_logger(plan, run_dir, resolved_config, labels, resume)
                predicted = None if current.prediction is None else current.prediction.step_s
                context = RunContext(run_dir, logger, history, predicted, timeline, carried)
                runner = launcher.runner(current.cfg, starting, context)
                schedule.watch(runner.timeline, cluster.cores_by_device(), cluster.cores_by_node())
                with runner.serving():
                    runner.init_workers()
                    if switch is None:
                        preemption.stop_if_requested()  # stopped while starting: no step to finish
                        startup_s = schedule.cost_s = time.monotonic() - started
                    else:
                        replaced.append(record_switch(runner.timeline, switch, switched))
                        schedule.cost_s = replaced[-1]["seconds"]
                    final = runner.run(schedule.due)
                timeline = runner.timeline
                if replaced or schedule.decisions:
                    info.update(replaced=replaced, replans=schedule.decisions)
                    (run_dir / RUN_INFO).write_text(json.dumps(info))
                if final is not None:  # the last step is done, or the run stopped early
                    break
                switch, switched, carried = schedule.take(), runner.switch_started, runner.carry()
                following = switch.plan.cfg
                following.runner.resume = str(checkpoint.resolve_resume("auto", run_dir / checkpoint.FOLDER))
                launcher.check_checkpoint(following, Path(following.runner.resume))
                log.info(f"rlplace: step {switch.step}: re-placing the run as {switch.to} ({sharing(switch.plan)})")
                cluster.replace(processes(switch.plan))
            assert final is not None
            final["run/startup_s"] = startup_s
            trained = time.monotonic()
        # The logger outlives the cluster so that the summary has the teardown too.
        final["run/teardown_s"] = time.monotonic() - trained
        summary = summarize(history)
        logger.log_summary({**summary, **{k: v for k, v in final.items() if k.startswith(SUMMARY_PREFIXES)}})
    finally:
        if logger is not None:
            logger.close()
    return final, schedule.current


def processes(plan: Plan) -> list[Placement]:
    """Every worker process of the plan's placement."""
    return [process for name in plan.placement for process in plan.placement.get_placements(name)]


def sharing(plan: Plan) -> str:
    """Which components each device holds, for the run's start line ("device 0: actor, env; device 1: ...")."""
    return "; ".join(
        f"device {device}: {', '.join(names) or 'idle'}" for device, names in plan.placement.device_sharing().items()
    )


def record_switch(timeline: Timeline, switch: Switch, began: float) -> dict[str, Any]:
    """A switch that has just ended (the new workers hold the checkpoint's state): its span on the timeline (the
    driver's "replace", from the checkpoint to now), a console line, and its run.json entry."""
    seconds = time.time() - began
    timeline.add(Span(name="replace", group="driver", rank=0, start=began, end=began + seconds))
    log.info(f"rlplace: re-placed as {switch.to} after step {switch.step} in {seconds:.1f} s")
    return {"step": switch.step, "to": switch.to, "seconds": seconds}


def run_overrides(argv: list[str]) -> list[str]:
    """The overrides that compose the run (Hydra's own settings left out, but for where option files are found)."""
    return [arg for arg in argv if not arg.startswith("hydra.") or arg.startswith("hydra.searchpath=")]


def log_ranking(ranking: list[Any], top: int) -> None:
    """placement=auto: the candidates it chose from, fastest first, and the chosen one's override line."""
    for number, candidate in enumerate(ranking[:top], 1):
        found = candidate.to_dict()
        stages = f", {found['stages']} stage(s)" if "stages" in found else ""  # embodied candidates have stages
        log.info(
            f"rlplace: auto #{number}: {found['prediction']['step_s']:.4f} s per step predicted, {found['mode']}, "
            f"{found['component_placement']}{stages}, K={found['max_staleness']}"
        )
    log.info(f"rlplace: placement=auto runs #1, the fastest predicted: {ranking[0].overrides}")


def _import_launcher(plan: Plan) -> Future[Launcher]:
    """The family's launcher module (`Plan.launcher`), imported on a thread of its own: torch and the worker classes
    load while Ray's processes start. An import error is raised where the launcher is asked for."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlplace-import-launcher")
    imported = pool.submit(lambda: plan.launcher)
    pool.shutdown(wait=False)  # the thread ends once the import is done
    return imported


def run_logger(
    plan: Plan, run_dir: Path, resolved_config: dict, labels: dict[str, Any], resume: Path | None
) -> MetricLogger:
    """The run's logger (metrics.jsonl, plus wandb when chosen), its wandb run named and tagged by mode and labels."""
    cfg, mode = plan.cfg, plan.placement.mode
    tags = [f"{key}{value}" for key, value in labels.items()]
    wandb = cfg.logger.wandb
    run = TrackerRun(
        config=resolved_config,
        project=wandb.project,
        name="-".join([mode, *tags, run_dir.name]),
        group=wandb.group,
        tags=[*wandb.tags, plan.family.name, cfg.task.name, mode, *tags],
        mode=wandb.mode,
    )
    return build_logger(
        cfg.logger.backend, run_dir, run, start_step=0 if resume is None else checkpoint.step_of(resume)
    )


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def run(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    # A single run starts with the command; a multirun job with itself (its process ran the jobs before it).
    started = time.monotonic() - (process_uptime_s() - _PROFILING_S[0] if hydra_cfg.mode == RunMode.RUN else 0.0)
    claim_run_folder(run_dir, "hydra.run.dir" if hydra_cfg.mode == RunMode.RUN else "hydra.sweep.dir")
    try:
        plan = resolve(cfg)
        if hydra_cfg.mode == RunMode.MULTIRUN and plan.cfg.logger.wandb.group is None:
            plan.cfg.logger.wandb.group = sweep_group(hydra_cfg)
        config = {**OmegaConf.to_container(cfg, resolve=True), **dashboard_config(plan, hydra_cfg)}
        overrides = run_overrides([*hydra_cfg.overrides.hydra, *hydra_cfg.overrides.task])
        # A basic launcher runs a multirun's jobs one after another in this process: they share one embedded Ray.
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        final, ended = train(plan, run_dir, config, started, switches(plan, overrides), keep_ray=multirun)
    except preemption.StoppedEarly as stopped:
        print(f"rlplace: {stopped}; run the same command again to start", file=sys.stderr)
        sys.exit(128 + stopped.signum)
    except (ConfigError, PlacementError, ClusterError) as err:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            # One combination of a sweep that this cluster cannot hold: skip it, keep sweeping.
            log.warning(f"rlplace: skipping job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): {err}")
            (run_dir / SKIPPED).write_text(f"{err}\n")
            return None
        fail(str(err))
    mode = ended.placement.mode if ended is plan else f"{ended.placement.mode} (re-placed)"
    line, objective = plan.launcher.summary(plan.cfg, mode, final, run_dir)
    log.info(line)
    log.info(
        f"rlplace: start-up {final['run/startup_s']:.1f} s (command to first step), "
        f"teardown {final['run/teardown_s']:.1f} s (last step to workers and Ray stopped)"
    )
    log.info(f"rlplace: timeline {run_dir / 'timeline.json'} (chrome://tracing or ui.perfetto.dev)")
    wandb_runs = sorted((run_dir / "wandb").glob("*run-*"))
    if wandb_runs:
        log.info(f"rlplace: wandb run {wandb_runs[-1]} (offline runs upload with `wandb sync`)")
    stopped_by = preemption.received()
    if stopped_by is not None:
        log.warning(
            f"rlplace: stopped by {signal.Signals(stopped_by).name} after a checkpoint; to continue, run the same "
            f"command with runner.resume=auto hydra.run.dir={run_dir}"
        )
        sys.exit(128 + stopped_by)
    return objective


_CLAIMED: dict[Path, int] = {}
"""Run folders this process holds (folder -> the open descriptor whose lock it holds until the process ends)."""


def claim_run_folder(run_dir: Path, key: str = "hydra.run.dir") -> None:
    """Hold an exclusive lock on the run folder for the rest of this process, or refuse (exit 2) a folder that
    another live run holds: two runs writing one folder would each exit 0 with one's results lost. The lock goes
    with the process, however it ends, so a stopped run's folder can be resumed (`runner.resume=auto`) at once.

    The default folders are already unique (conf/train.yaml names them to the microsecond); this catches the same
    folder given twice (`hydra.run.dir=...`). Hydra has written the run's `.hydra/` files by the time a job runs,
    which is why `main` claims a folder given on the command line before Hydra starts.
    """
    run_dir = run_dir.absolute()
    if run_dir in _CLAIMED or not run_dir.is_dir():
        return
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        fail(
            f"{key} = '{run_dir}' is in use by another run that is still running: runs never share a folder; "
            "choose another folder, or wait for that run to end (runner.resume=auto continues it)"
        )
    _CLAIMED[run_dir] = fd


def dashboard_config(plan: Plan, hydra_cfg: Any) -> dict[str, Any]:
    """What the run's wandb config adds to the resolved config, for a dashboard to group and filter runs by: the
    placement mode the run took and the option chosen in each config group (`presets.placement`,
    `presets.experiment`, `presets.sweep`, ...), which the resolved values alone do not name."""
    choices = {group: option for group, option in hydra_cfg.runtime.choices.items() if not group.startswith("hydra")}
    return {"placement_mode": plan.placement.mode, "presets": choices}


class EveryJobSkipped(Callback):
    """Ends a multirun in which no job ran (every combination refused) with exit code 2 instead of 0."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = [path.parent for path in sweep_dir.glob("*/.hydra")]
        if jobs and all((job / SKIPPED).exists() for job in jobs):
            fail(f"every job of the multirun in {sweep_dir} was skipped (reasons: {sweep_dir}/*/{SKIPPED})")


class StopsLaunchersRay(Callback):
    """Stops, at the multirun's exit, a Ray that a launcher started in this process (Hydra's Ray launcher), with
    nothing of it left behind: its session folder included, which Ray itself keeps."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if "ray" in sys.modules:  # else no Ray was started (importing it would cost the multirun a second)
            from rlplace.scheduler.session import stop_at_exit_if_started_elsewhere

            stop_at_exit_if_started_elsewhere()


def sweep_group(hydra_cfg: Any) -> str:
    """The wandb group of a multirun's jobs: the sweep preset's name (or `multirun`) and the multirun's start time,
    so that each sweep is a group of its own."""
    name = hydra_cfg.runtime.choices.get("sweep") or "multirun"
    return "-".join([name, *Path(hydra_cfg.sweep.dir).parts[-2:]])


def check_tracker(cfg: Any) -> None:
    """Refuse a tracker that could not start here (`wandb_unavailable`): the logger starts beside the workers, so its
    failure would otherwise come after them."""
    if cfg.logger.backend == "wandb" and (why := wandb_unavailable(cfg.logger.wandb.mode)) is not None:
        setting = os.environ.get("WANDB_MODE") and f"WANDB_MODE = {os.environ['WANDB_MODE']!r}"
        raise ConfigError(
            f"{setting or f'logger.wandb.mode = {cfg.logger.wandb.mode!r}'} is invalid here: {why}; valid without "
            "one: offline (upload later with `wandb sync`), disabled"
        )


def check_run(composed: DictConfig, argv: list[str]) -> None:
    """Refuse (exit 2, one line) a single run that `run` would refuse, before Hydra makes its folder and logging and
    before Ray is imported: its config and placement (`resolve`), the checkpoint it resumes (files, manifest and
    runner state; whether it fits this run is checked by `train`, which needs the family's launcher), a tracker that
    cannot log in, and a cluster that cannot hold it (`check_start`: this machine's cores and GPUs, or a Ray head at
    `cluster.address`)."""
    run_dir = Path(composed.hydra.run.dir)
    cfg = OmegaConf.masked_copy(composed, [key for key in composed if key != "hydra"])
    try:
        plan = resolve(cfg)
        switches(plan, run_overrides(argv))
        check_tracker(plan.cfg)
        resume = checkpoint.resolve_resume(plan.cfg.runner.resume, run_dir / checkpoint.FOLDER)
        if resume is not None:
            checkpoint.read_state(resume, plan.family.name)
        from rlplace.scheduler import check_start  # Ray loads only for a config that passed the rest

        check_start(plan.cfg.cluster, [p for name in plan.placement for p in plan.placement.get_placements(name)])
    except (ConfigError, PlacementError, ClusterError) as err:
        fail(str(err))


_PROFILING_S = [0.0]
"""Seconds this process spent on `profile_first`'s run, which the run's own start-up does not include."""
PROFILE_STEPS = 6
"""Steps of the profiling run that `placement=auto` without `plan.profile` starts first: the warm-up steps, then
enough measured ones for the run's own times (the profile itself is written after them)."""


def profile_first(composed: DictConfig, argv: list[str]) -> list[str]:
    """`placement=auto` without `plan.profile`: profile a short run of the same task first (in the family's
    `profile_placement` for the cluster) into `<run folder>-profile`, and return the arguments with that profile
    added. It runs in this process on an embedded Ray that stays up for the run it plans, which takes over its
    devices and worker processes where the chosen placement has the same devices (`scheduler/parking.py`). Its
    failure exits as the run would, and a stop (Ctrl-C, SIGTERM) during it ends the command."""
    try:
        family = family_of(OmegaConf.masked_copy(composed, [key for key in composed if key != "hydra"]))
    except ConfigError as err:
        fail(str(err))
    folder = Path(composed.hydra.run.dir).absolute()
    folder = folder.with_name(folder.name + "-profile")
    devices = composed.cluster.num_nodes * composed.cluster.num_devices_per_node
    placement = family.profile_placement(devices)
    dropped = (
        "placement=",
        "runner.max_steps=",
        "runner.max_epochs=",
        "runner.resume=",
        "runner.save_interval=",
        "runner.replace_at=",
        "runner.replan_interval=",
        "logger=",
        "hydra.",
    )
    kept = [arg for arg in argv if not arg.startswith(dropped) or arg.startswith("hydra.searchpath=")]
    print(  # before Hydra sets up logging
        f"rlplace: placement=auto without plan.profile: profiling {PROFILE_STEPS} steps of the {placement} placement "
        f"first (its start-up, the steps, then the profile), into {folder}",
        file=sys.stderr,
    )
    profiled = [f"placement={placement}", f"runner.max_steps={PROFILE_STEPS}", "runner.profile=true"]
    profiled += ["runner.save_interval=null", "logger=jsonl"]
    start = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    claim_run_folder(folder)
    cfg = compose_run([*kept, *profiled])
    try:
        with _logged_to(folder / "train.log"):
            train(resolve(cfg), folder, OmegaConf.to_container(cfg, resolve=True), keep_ray=True)
    except preemption.StoppedEarly as stopped:
        print(f"rlplace: the profiling run in {folder}: {stopped}", file=sys.stderr)
        sys.exit(128 + stopped.signum)
    except (ConfigError, PlacementError, ClusterError) as err:
        fail(f"placement = 'auto': the profiling run in {folder} cannot run: {err}")
    stopped_by = preemption.received()
    if stopped_by is not None:
        print(f"rlplace: stopped by {signal.Signals(stopped_by).name} while profiling in {folder}", file=sys.stderr)
        sys.exit(128 + stopped_by)
    _PROFILING_S[0] = time.monotonic() - start
    return [*argv, f"plan.profile={folder}"]


@contextmanager
def _logged_to(path: Path) -> Iterator[None]:
    """The run's messages on the console and in `path` while Hydra's logging (set up per job) is not there yet."""
    handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(path)]  # where Hydra's console handler writes
    handlers[0].setFormatter(logging.Formatter("%(message)s"))
    handlers[1].setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    level = log.level
    log.setLevel(logging.INFO)
    for handler in handlers:
        log.addHandler(handler)
    try:
        yield
    finally:
        log.setLevel(level)
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()


def main() -> None:
    """`rlplace-train`: the overrides are checked first, and a single run as a whole (`check_run`): bad ones exit 2
    with one line; then Hydra runs the job(s). A Ctrl-C that got past the first one (which stops after the step, see
    `preemption`) ends with one line too."""
    import_from_start_directory()
    composed = check_overrides(sys.argv[1:])
    if composed is not None and composed.plan.auto and composed.plan.profile is None:
        sys.argv = [sys.argv[0], *profile_first(composed, sys.argv[1:])]  # Hydra reads the run's overrides there
        composed = check_overrides(sys.argv[1:])
    given = [arg.split("=", 1)[1] for arg in sys.argv[1:] if arg.startswith("hydra.run.dir=")]
    if given and not any(arg in ("-m", "--multirun") for arg in sys.argv[1:]):
        claim_run_folder(Path(given[-1]))  # before Hydra writes its files into a folder that another run holds
    if composed is not None:
        check_run(composed, sys.argv[1:])
    try:
        run()
    except KeyboardInterrupt:
        print("rlplace: aborted by Ctrl-C; the newest checkpoint is the one to resume from", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
