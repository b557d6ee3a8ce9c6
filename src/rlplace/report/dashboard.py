"""The sweep report on wandb, beside the sweep's runs: one run of job type "report" in the sweep's project and group
holding the table (a wandb Table), the charts (images), and report.md with each job's timeline.json (an artifact).

A sweep whose jobs logged to wandb (`logger=wandb`) gets it, in the jobs' wandb mode (offline by default: the run
folder lands in `<multirun folder>/wandb/` for `wandb sync`). Everything is read from the multirun folder, so the
callback at the end of a sweep and `rlplace-report` later log the same, into the same wandb run.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlplace.report.collect import ReportError, one_line_yaml
from rlplace.report.write import Report

REPORT_ID_FILE = "wandb_report_id.txt"
"""The report run's wandb id, kept in the multirun folder: writing the report again continues the same run."""


@dataclass(frozen=True)
class SweepLogging:
    """How the sweep's jobs logged, from multirun.yaml."""

    backend: str
    project: str
    group: str
    mode: str
    tags: tuple[str, ...] = ()


def sweep_logging(multirun_dir: Path) -> SweepLogging | None:
    """The sweep's logger settings and its wandb group (the one `rlplace.train.sweep_group` gives its jobs: the
    sweep preset's name, or `multirun`, and the multirun folder's date and time); None without a multirun.yaml."""
    file = multirun_dir / "multirun.yaml"
    if not file.is_file():
        return None
    try:
        config = yaml.safe_load(file.read_text()) or {}
        logger = config.get("logger") or {}
    except (yaml.YAMLError, AttributeError) as err:
        raise ReportError(f"{file} is not a multirun's config ({one_line_yaml(err)})") from None
    wandb = logger.get("wandb") or {}
    sweep = ((config.get("hydra") or {}).get("runtime") or {}).get("choices", {}).get("sweep")
    group = wandb.get("group") or "-".join([sweep or "multirun", *multirun_dir.absolute().parts[-2:]])
    return SweepLogging(
        backend=logger.get("backend", "jsonl"),
        project=wandb.get("project", "rlplace"),
        group=group,
        mode=wandb.get("mode", "offline"),
        tags=tuple(wandb.get("tags") or ()),
    )


def _cell(text: str) -> Any:
    """A table cell as wandb should sort and plot it: a number where the report shows one (1300, 1.30x, 1.17M,
    95%), else the text ("-", "n/a", a mode)."""
    match = re.fullmatch(r"(-?[\d.]+)([kMG%x*]?)", text)
    if not match:
        return text
    try:
        value = float(match[1])
    except ValueError:
        return text
    scale = {"k": 1e3, "M": 1e6, "G": 1e9, "%": 0.01}.get(match[2], 1.0)
    number = value * scale
    return int(number) if match[2] == "*" or (match[2] == "" and "." not in match[1]) else number


def log_report(report: Report, settings: SweepLogging) -> Path | None:
    """Log `report` to wandb as the report run of the sweep's group; its local run folder (None if wandb wrote
    none: mode disabled)."""
    import wandb  # deferred: importing wandb is slow, and reports of jsonl sweeps never need it

    multirun_dir = report.path.parent
    mode = os.environ.get("WANDB_MODE") or settings.mode  # as for the runs (`metrics.logger.WandbLogger`)
    id_file = multirun_dir / REPORT_ID_FILE
    if not id_file.exists():
        id_file.write_text(uuid.uuid4().hex[:12])
    run = wandb.init(
        project=settings.project,
        group=settings.group,
        job_type="report",
        name=f"report-{settings.group}",
        tags=[*settings.tags, "report"],
        config={"multirun_dir": str(multirun_dir.absolute()), "jobs": len(report.results)},
        mode=mode,
        dir=str(multirun_dir),
        id=id_file.read_text().strip(),
        resume="allow",
        reinit="finish_previous",
        settings=wandb.Settings(silent=True, console="off"),
    )
    try:
        table = wandb.Table(
            columns=report.headers, data=[[_cell(c) for c in row] for row in report.rows], allow_mixed_types=True
        )
        images = {f"charts/{image.stem}": wandb.Image(str(image)) for image in report.images}
        run.log({"report/table": table, **images})
        ran = [r for r in report.results if not r.skipped and r.n]
        if ran:
            fastest = max(ran, key=lambda r: r.median_throughput)
            run.summary.update({"report/fastest_job": fastest.job, "report/fastest_title": fastest.title})
            if not math.isnan(fastest.median_throughput):
                run.summary["report/fastest_throughput"] = fastest.median_throughput
        run.summary["report/recommendation"] = report.advice
        artifact = wandb.Artifact(_artifact_name(settings.group), type="sweep-report")
        artifact.add_file(str(report.path), name="report.md")
        for image in report.images:
            artifact.add_file(str(image), name=image.name)
        for result in report.results:
            timeline = result.path / "timeline.json"
            if not result.skipped and timeline.is_file():
                artifact.add_file(str(timeline), name=f"timeline_{result.job}.json")
        run.log_artifact(artifact)
        folder = Path(run.dir).parent if mode != "disabled" else None
    finally:
        run.finish()
    return folder


def _artifact_name(group: str) -> str:
    """An artifact name wandb accepts (letters, digits, dashes, underscores and dots) for the sweep's group."""
    return "report-" + re.sub(r"[^A-Za-z0-9_.-]", "-", group)
