"""The task families a run can belong to, and `resolve`: composed config -> typed config -> checked placement.

The family of a run is the one whose task schema the chosen `task` option starts from (the family's task dataclass or
an extension of it, such as a reasoning task's own schema); its other sections must come from the same family. Both
CLIs resolve through here, so what `rlplace-plan` prints is what `rlplace-train` runs. Only light modules are imported:
the family's launcher (`core.launcher.Launcher`: Ray, torch) is imported when a run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from omegaconf import DictConfig, OmegaConf

from rlplace.core import checkpoint
from rlplace.core.config import RunConfig, options_of, register_schema, to_typed
from rlplace.core.config import register as register_core
from rlplace.core.errors import ConfigError
from rlplace.core.registry import Registry
from rlplace.embodied import checks as embodied_checks
from rlplace.embodied import config as embodied_config
from rlplace.embodied import planning as embodied_planning
from rlplace.embodied import profile as embodied_profile
from rlplace.placement import ComponentPlacement, HybridComponentPlacement
from rlplace.planner import ProfileError
from rlplace.reasoning import checks as reasoning_checks
from rlplace.reasoning import config as reasoning_config
from rlplace.reasoning import memory as reasoning_memory
from rlplace.reasoning import planning as reasoning_planning
from rlplace.reasoning import profile as reasoning_profile
from rlplace.reasoning.tasks import TASKS as REASONING_TASKS
from rlplace.reasoning.tasks import steps_for_epochs

if TYPE_CHECKING:
    from rlplace.core.launcher import Launcher

OPTION_SECTIONS = {"task": "name", "model": "name", "algorithm": "name", "rollout": "backend"}
"""The sections chosen by a config group option, and the field that names the option's kind."""


@dataclass(frozen=True)
class Family:
    """One task family: its run schema, its checks that need the placement, and the module that launches it."""

    name: str
    schema: type[RunConfig]
    """The whole run's dataclass (EmbodiedConfig, ReasoningConfig)."""
    check: Callable[[Any, ComponentPlacement], None]
    """Checks that need the placement, run before any worker starts."""
    launcher: Callable[[], Launcher]
    """Imports and returns the family's launcher (torch and the worker classes load then, not when configs are
    checked)."""
    predict: Callable[[Any, ComponentPlacement], Any]
    """With `plan.profile`: the prediction of the run as placed (an object with `step_s` and `to_dict()`), which
    rlplace-plan prints and each step of the run is checked against."""
    search: Callable[[Any], list[Any]]
    """`plan.search` with `plan.profile`: every candidate of the run's cluster, fastest first (objects with
    `max_staleness`, `prediction`, `overrides` and `to_dict()`); ProfileError when the profile cannot serve the run."""
    place: Callable[[Any, Any], Any]
    """The config placed as a candidate of `search` (`choose`)."""
    profile_placement: Callable[[int], str]
    """The placement preset a short profiling run takes on a cluster of that many devices (`placement=auto` without
    `plan.profile`): the one whose profile predicts the others best."""
    shape: Callable[[Any], dict[str, Any]]
    """The sizes that fix a run's step (profile.json's `config`): a re-plan writes them into the profile of the
    run's own last steps (`rlplace.replace.own_profile`)."""
    own_sections: tuple[str, ...] = ()
    """Sections of this family alone whose config group's options start from `/schema/<section>/<family>` (the
    reasoning `reward`); other families' runs leave them unset."""
    memory: Callable[[Any, ComponentPlacement], Any] | None = None
    """The predicted device memory per device and phase (an object with `to_dict()`, or None when unknown), for
    `rlplace-plan`; None where the family has no memory model yet."""
    epoch_steps: Callable[[Any], int] | None = None
    """The steps of `runner.max_epochs` passes over the run's training data; None where the family has no data to
    pass over."""
    option_schemas: Mapping[str, Registry[type]] = field(default_factory=dict)
    """Sections whose options each start from a schema of their own (schema per option): section -> the registry of
    those schemas by name, each an extension of the section's dataclass. Options of the other sections start from
    the section's dataclass itself, `/schema/<section>/<family>`."""

    def option_types(self) -> dict[str, type]:
        """Section -> the dataclass this family's options of that config group start from or extend."""
        hints = get_type_hints(self.schema)
        return {section: hints[section] for section in OPTION_SECTIONS}

    def schemas(self, section: str) -> dict[str, type]:
        """The schemas this family's options of config group `section` start from, by their name in Hydra's
        ConfigStore (`/schema/<section>/<name>`)."""
        if section in self.option_schemas:
            return dict(self.option_schemas[section].items())
        return {self.name: self.option_types()[section]}

    def owns(self, section: str, node_type: type | None) -> bool:
        """Whether a section typed `node_type` (its option's schema) belongs to this family."""
        return isinstance(node_type, type) and issubclass(node_type, self.option_types()[section])

    def options(self, section: str) -> list[str]:
        """The options of config group `section` (rlplace's own files) that belong to this family (none for a group
        both families share, such as `logger`)."""
        return options_of(section, self.schemas(section)) if section in OPTION_SECTIONS else []


def _embodied_launcher() -> Launcher:
    from rlplace.embodied import launch

    return launch


def _reasoning_launcher() -> Launcher:
    from rlplace.reasoning import launch

    return launch


FAMILIES = (
    Family(
        "embodied",
        embodied_config.EmbodiedConfig,
        embodied_checks.check_embodied,
        _embodied_launcher,
        predict=embodied_planning.predict_placed,
        search=embodied_planning.ranked,
        place=embodied_planning.place,
        # Each component on devices of its own where there are enough: the least contended units.
        profile_placement=lambda devices: "disaggregated" if devices >= 4 else "hybrid",
        shape=embodied_profile.shape,
    ),
    Family(
        "reasoning",
        reasoning_config.ReasoningConfig,
        reasoning_checks.check_reasoning,
        _reasoning_launcher,
        predict=reasoning_planning.predict_placed,
        search=reasoning_planning.ranked,
        place=reasoning_planning.place,
        # Two ranks a component, offloading and training apart: between the others in everything the model scales.
        profile_placement=lambda devices: "reasoning_hybrid" if devices >= 2 else "reasoning_collocated",
        shape=reasoning_profile.shape,
        own_sections=("reward", "actor", "inference"),
        memory=reasoning_memory.predict_memory,
        option_schemas={"task": REASONING_TASKS},
        epoch_steps=lambda cfg: steps_for_epochs(cfg.task, cfg.runner.max_epochs),
    ),
)


@dataclass
class Plan:
    """A resolved run: its family, typed config, and the placement of every component."""

    family: Family
    cfg: Any
    placement: ComponentPlacement
    ranking: list[Any] | None = None
    """`placement=auto`: the candidates it was chosen from, fastest first (the run's is the first)."""
    prediction: Any = None
    """With `plan.profile`: the planner's prediction for this run (`step_s`, `to_dict()`); None without one."""

    @property
    def launcher(self) -> Launcher:
        return self.family.launcher()


def register() -> None:
    """Register the primary schema and every family's option schemas with Hydra (idempotent): option files of group
    `model` start from `/schema/model/<family>`, a reasoning task's from `/schema/task/<task name>`, and so on."""
    register_core()
    taken: dict[tuple[str, str], type] = {}
    for family in FAMILIES:
        for section in OPTION_SECTIONS:
            for name, node in family.schemas(section).items():
                if taken.setdefault((section, name), node) is not node:
                    raise ValueError(f"/schema/{section}/{name} names two schemas: {taken[section, name]} and {node}")
                register_schema(section, name, node)
        hints = get_type_hints(family.schema)
        for section in family.own_sections:
            register_schema(section, family.name, hints[section])


def family_of(cfg: DictConfig) -> Family:
    """The family whose task schema the task option starts from; every other option must be of the same family."""
    task_type = OmegaConf.get_type(cfg, "task")
    family = next((f for f in FAMILIES if f.owns("task", task_type)), None)
    if family is None:
        schemas = "|".join(name for f in FAMILIES for name in f.schemas("task"))
        raise ConfigError(
            f"task = {OmegaConf.to_container(cfg.task)!r}: a task option must start from a task schema "
            f"(defaults: [/schema/task/<{schemas}>@_here_])"
        )
    for section, key in OPTION_SECTIONS.items():
        node_type = OmegaConf.get_type(cfg, section)
        if not family.owns(section, node_type):
            other = next((f"the {f.name} family" for f in FAMILIES if f.owns(section, node_type)), "no family")
            raise ConfigError(
                f"{section}: the chosen option ({section}.{key} = {cfg[section].get(key)!r}) belongs to {other}, "
                f"but task.name = {cfg.task.name!r} is of the {family.name} family (valid: "
                f"{', '.join(f'{section}={name}' for name in family.options(section))})"
            )
    return family


def with_epochs(family: Family, cfg: Any) -> Any:
    """`cfg` with runner.max_steps set by runner.max_epochs, when that is set; ConfigError for a family or task
    without epochs."""
    epochs = cfg.runner.max_epochs
    if epochs is None:
        return cfg
    if family.epoch_steps is None:
        raise ConfigError(
            f"runner.max_epochs = {epochs} is invalid for {family.name} tasks: they read no training data (valid: "
            "null, with runner.max_steps)"
        )
    cfg.runner = replace(cfg.runner, max_steps=family.epoch_steps(cfg))  # checked again with its new length
    return cfg


def choose(family: Family, cfg: Any) -> tuple[Any, list[Any]]:
    """`placement=auto` (and a re-plan): the run placed as the fastest candidate of `plan.profile`'s search at the
    run's own staleness (K changes what is trained, the placement does not), and the ranking it was chosen from.
    ConfigError when the profile cannot serve the run or no candidate fits its cluster."""
    try:
        ranked = [r for r in family.search(cfg) if r.max_staleness == cfg.runner.max_staleness]
    except ProfileError as err:
        raise ConfigError(str(err)) from None
    if not ranked:
        raise ConfigError(
            f"placement = 'auto': no placement of this run fits cluster.num_devices_per_node = "
            f"{cfg.cluster.num_devices_per_node} x {cfg.cluster.num_nodes} node(s) (valid: a placement preset)"
        )
    return family.place(cfg, ranked[0]), ranked


def resolve(cfg: DictConfig) -> Plan:
    """Turn a composed config into a checked plan; raises ConfigError or PlacementError naming key and value."""
    family = family_of(cfg)
    typed = with_epochs(family, to_typed(cfg, family.schema, family.name))
    ranking = None
    if typed.plan.auto:
        typed, ranking = choose(family, typed)
    placement = HybridComponentPlacement(typed)
    family.check(typed, placement)
    if typed.runner.resume not in (None, *checkpoint.RESUME_AUTO):  # `auto` needs the run folder: `train` checks it
        # That the path is a checkpoint folder; its files are read and checked once, by `train`, before start.
        checkpoint.resolve_resume(typed.runner.resume, Path(), verify_files=False)
    prediction = None
    if ranking:  # the chosen candidate was predicted as the run is placed
        prediction = ranking[0].prediction
    elif typed.plan.profile is not None:
        try:
            prediction = family.predict(typed, placement)
        except ProfileError as err:
            raise ConfigError(str(err)) from None
    return Plan(family, typed, placement, ranking, prediction)
