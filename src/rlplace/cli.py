"""What the command-line entry points share: the config tree, composing it, and refusing bad input as one line.

A config or placement that cannot run is refused with one line on stderr naming the key and value, and exit code 2,
before Ray or any worker starts. `rlplace-pretrain` lives here too: it composes the same overrides as
`rlplace-train` and makes (or finds) the model a reasoning run would start from.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from rlplace.core.config import CONF_DIR
from rlplace.core.errors import ConfigError
from rlplace.families import Plan, register, resolve
from rlplace.placement import PlacementError

EXIT_BAD_CONFIG = 2


def import_from_start_directory() -> None:
    """Make the directory the command starts in importable, as `python -m` does, so that `package.module:function`
    (a reward, a tool) names a module of that directory; also for the worker processes, which start on this machine
    with this process's environment (PYTHONPATH). A console script, unlike `python -m`, puts only its own folder on
    `sys.path`."""
    start = os.getcwd()
    if start not in sys.path:
        sys.path.insert(0, start)
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if start not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([start, *paths])


def fail(message: str) -> NoReturn:
    """Report a refused config as one line on stderr and exit with code 2."""
    print(f"rlplace: error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_CONFIG)


def describe_compose_error(err: Exception) -> str:
    """One line from Hydra's composition error and its cause (which says what the value should have been)."""
    parts = [" ".join(str(err).split("Config search path")[0].split())]
    if err.__cause__ is not None:
        parts.append(str(err.__cause__).splitlines()[0])
    return ": ".join(parts)


def compose_run(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """The run config that `rlplace-train` would compose from `overrides` (with Hydra's own section if asked),
    without creating a run folder or logging; composition errors exit 2 with one line."""
    try:
        return compose_config(overrides, with_hydra)
    except ConfigError as err:
        fail(str(err))


def compose_config(overrides: list[str], with_hydra: bool = False) -> DictConfig:
    """`compose_run`, raising ConfigError (one line) for overrides that do not compose."""
    register()
    try:
        refuse_sweeps(OverridesParser.create().parse_overrides(overrides))
        if GlobalHydra.instance().is_initialized():  # inside rlplace-train (a sweep's report callback): our tree
            return compose(config_name="train", overrides=overrides, return_hydra_config=with_hydra)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=overrides, return_hydra_config=with_hydra)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(describe_compose_error(err)) from None


def refuse_sweeps(overrides: list[Override]) -> None:
    """Refuse a value with a comma outside a multirun, which Hydra reads as a sweep (`actor=0,5`) and then refuses
    as ambiguous in a page of text: one line that says how to give it as one string instead."""
    for override in overrides:
        if override.is_sweep_override():
            key, value = override.get_key_element(), ",".join(override.sweep_string_iterator())
            fail(
                f"{key}={value}: a value with a comma is a sweep, which only a multirun (-m) runs; for one value, "
                f"quote it: '{key}=\"{value}\"'"
            )


def check_writable(key: str, folder: str) -> None:
    """Refuse an output folder that cannot be created or written: its nearest existing parent decides, by having a
    folder made in it (permissions alone do not tell, for root, a read-only mount or /proc)."""
    path = Path(folder).absolute()
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():
        fail(f"{key} = {folder!r}: cannot write the run's outputs there ({existing} is not a folder)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlplace-write-check-", dir=existing))
    except OSError as err:
        fail(f"{key} = {folder!r}: cannot write the run's outputs there ({existing}: {err.strerror or err})")


HYDRA_ANSWERS = frozenset(
    "-h --help --hydra-help -c --cfg -i --info -p --package -sc --shell-completion --version "
    "-cp --config-path -cn --config-name -cd --config-dir".split()
)
"""Flags after which Hydra answers a question or reads another config tree: no run to check up front."""


def check_overrides(argv: list[str]) -> DictConfig | None:
    """Compose what `rlplace-train` was given before Hydra does, so that a composition error (an unknown option,
    key or value type) exits 2 with one line instead of Hydra's exit 1 and its multi-line report.

    A multirun's sweeps are checked value by value, each with the other overrides' fixed values. Returns a single
    run's config (with Hydra's section) for the caller to check further; None for a multirun, or for a question to
    Hydra (`--help`, `--cfg`, ...).
    """
    if any(arg.split("=")[0] in HYDRA_ANSWERS for arg in argv):
        return None
    try:
        parsed = OverridesParser.create().parse_overrides([arg for arg in argv if not arg.startswith("-")])
    except HydraException as err:
        fail(describe_compose_error(err))
    groups = sorted(path.name for path in CONF_DIR.iterdir() if path.is_dir())
    for override in parsed:
        if override.is_delete() and override.key_or_group in groups:
            group = override.key_or_group
            options = "|".join(sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml")))
            hint = "; logger=none turns logging off" if group == "logger" else ""
            fail(f"~{group}: a config group cannot be removed, choose one of its options ({group}={options}){hint}")
    fixed = [override.input_line for override in parsed if not override.is_sweep_override()]
    sweeps = [override for override in parsed if override.is_sweep_override()]
    composed = compose_run(fixed, with_hydra=True)
    hydra = composed.hydra
    # A multirun is asked for with -m, or by a preset that sets hydra.mode (sweep=placement_modes).
    multirun = any(arg in ("-m", "--multirun") for arg in argv) or hydra.mode == RunMode.MULTIRUN
    if not multirun:
        refuse_sweeps(sweeps)
    for override in sweeps:
        for value in override.sweep_string_iterator():
            compose_run([*fixed, f"{override.get_key_element()}={value}"])
    check_writable(*(("hydra.sweep.dir", hydra.sweep.dir) if multirun else ("hydra.run.dir", hydra.run.dir)))
    return None if multirun else composed


def resolve_or_fail(cfg: DictConfig) -> Plan:
    """`resolve`, with a refused config or placement reported as one line and exit code 2."""
    try:
        return resolve(cfg)
    except (ConfigError, PlacementError) as err:
        fail(str(err))


def pretrain_main(argv: list[str] | None = None) -> None:
    """`rlplace-pretrain`: make (or find) the pretrained model of the run that the same overrides describe."""
    import_from_start_directory()
    plan = resolve_or_fail(compose_run(sys.argv[1:] if argv is None else argv))
    if plan.family.name != "reasoning":
        fail(f"task.name = {plan.cfg.task.name!r}: rlplace-pretrain pretrains the LM of a reasoning task")
    # torch and the pretraining code (transformers) load only now: they take seconds, which a refusal need not wait
    # for, and plan and train need neither.
    import torch

    from rlplace.reasoning.pretrain import STATS_FILE, pretrained_model_path

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        folder = pretrained_model_path(plan.cfg)
    except ConfigError as err:
        fail(str(err))
    except KeyboardInterrupt:  # pretraining writes into a temporary folder, removed on the way out: nothing cached
        print("rlplace: pretraining aborted by Ctrl-C; nothing was cached", file=sys.stderr)
        sys.exit(130)
    stats_file = folder / STATS_FILE
    accuracy = json.loads(stats_file.read_text())["accuracy_after"] if stats_file.is_file() else None
    print(f"model: {folder}" + ("" if accuracy is None else f"  accuracy: {accuracy:.3f}"))
