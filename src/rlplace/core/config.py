"""The shared run schema: what every run has, whatever its task family.

A run's config is composed by Hydra from `rlplace/conf/train.yaml`. Its primary schema (`TrainSchema`) types the shared
sections here; the family sections (`task`, `model`, `algorithm`, `rollout`, ...) are typed by their option files,
each of which starts from its family's base dataclass in the ConfigStore (Hydra's schema-per-option pattern), so a
wrong key or type is refused while composing. `to_typed` then builds the family's own dataclass (for example
`rlplace.embodied.config.EmbodiedConfig`) and runs every section's `__post_init__` checks, before Ray or any worker
starts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf

from rlplace.core.errors import ConfigError, check, check_choice
from rlplace.core.lr_schedule import LR_DECAYS
from rlplace.metrics.logger import BACKENDS as LOGGER_BACKENDS

T = TypeVar("T")

CONF_DIR = Path(str(resources.files("rlplace") / "conf"))
"""The Hydra config tree, package data of `rlplace`: found the same way in a checkout and in an installed wheel."""


def output_root() -> Path:
    """Where runs and caches go: `$RLPLACE_OUTPUT_DIR`, else `outputs/` in the launch folder (as train.yaml's run
    folders do), so a job scheduler can point every run of a project at one place."""
    return Path(os.environ.get("RLPLACE_OUTPUT_DIR", "outputs"))


@dataclass
class ClusterConfig:
    """The devices a run holds and how Ray is reached."""

    num_nodes: int = 1
    """Nodes in the cluster; devices are numbered node-major across them."""
    num_devices_per_node: int = 2
    """Devices per node: GPUs, or logical devices (disjoint sets of CPU cores) when device_type=cpu."""
    device_type: str = "cpu"
    """`cpu`: logical devices backed by CPU cores, so placement has a real cost without GPUs; `gpu`: NVIDIA GPUs."""
    address: str | None = None
    """None starts an embedded local Ray; `auto` or `host:port` attaches to a running cluster."""
    cpus_per_device: int | None = None
    """Cores owned by each logical device; None splits each node's cores evenly."""
    dashboard: bool = False
    """Start Ray's dashboard with the embedded cluster."""
    namespace: str | None = None
    """Ray namespace; None gives every run its own."""
    connect_timeout_s: float = 30.0
    """How long to try reaching the cluster at `address` before giving up with an error."""
    reserve_timeout_s: float = 600.0
    """How long to wait for Ray to reserve the run's devices (placement groups) while other runs on the same Ray hold
    them, before giving up with an error."""
    max_oversubscription: float = 4.0
    """Most worker processes per CPU core a cpu cluster may be asked to run; more is refused before launch."""
    component_placement: dict[str, Any] = field(default_factory=dict)
    """Component (or `a,b` for several) -> devices; the grammar is in docs/placement.md and rlplace.placement."""
    device_memory_gb: float | None = None
    """Memory of each device in GB: reasoning runs whose predicted peak on some device exceeds it are refused before
    anything starts (`rlplace.reasoning.memory`); None checks nothing."""

    def __post_init__(self) -> None:
        check(self.num_nodes >= 1, "cluster.num_nodes", self.num_nodes, "at least 1")
        check(self.num_devices_per_node >= 1, "cluster.num_devices_per_node", self.num_devices_per_node, "at least 1")
        check_choice("cluster.device_type", self.device_type, ("cpu", "gpu"))
        memory = self.device_memory_gb
        check(memory is None or memory > 0, "cluster.device_memory_gb", memory, "null or positive")
        check(
            self.cpus_per_device is None or self.cpus_per_device >= 1,
            "cluster.cpus_per_device",
            self.cpus_per_device,
            "null or at least 1",
        )
        check(self.connect_timeout_s > 0, "cluster.connect_timeout_s", self.connect_timeout_s, "positive")
        check(self.reserve_timeout_s > 0, "cluster.reserve_timeout_s", self.reserve_timeout_s, "positive")
        check(self.max_oversubscription > 0, "cluster.max_oversubscription", self.max_oversubscription, "positive")

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.num_devices_per_node


@dataclass
class ComponentConfig:
    """What every component section says about sharing devices (placement presets set it)."""

    enable_offload: bool = False
    """Move weights (and optimizer state) to pinned CPU memory while another component uses the shared devices."""


@dataclass
class PolicyGradientConfig:
    """The clipped policy-gradient hyperparameters both families share (names follow the PPO paper and CleanRL).

    Each family's algorithm section extends it; the update functions take that section as it is."""

    name: str = "ppo"
    """The algorithm; each family says which it has."""
    group_size: int = 4
    """Samples compared with each other: responses per prompt (reasoning), or neighbouring sub-envs for the embodied
    `group_norm` estimator."""
    gamma: float = 0.99
    gae_lambda: float = 0.95
    lr: float = 2.5e-4
    anneal_lr: bool = True
    """Decay the learning rate over runner.max_steps after the warmup (`lr_decay`, down to `min_lr_ratio` x lr);
    false keeps it constant (`core.lr_schedule`)."""
    lr_decay: str = "linear"
    """With anneal_lr: `linear` (CleanRL's anneal_lr) or `cosine`."""
    lr_warmup_steps: int = 0
    """Steps whose rate rises linearly to lr first (step s uses (s + 1) / lr_warmup_steps of it); 0: none."""
    min_lr_ratio: float = 0.0
    """With anneal_lr: the share of lr the decay ends at."""
    update_epochs: int = 4
    num_minibatches: int = 4
    """Minibatches (optimizer steps) per epoch over the whole batch (all actor ranks together)."""
    clip_ratio_low: float = 0.2
    """The ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high] (asymmetric: DAPO's clip-higher)."""
    clip_ratio_high: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    clip_vloss: bool = True
    """Clip the critic's prediction to within clip_ratio_low of its rollout-time value (CleanRL's clip_vloss)."""
    off_policy_correction: str = "decoupled"
    """How the policy loss corrects for rollouts sampled by an older (behaviour) policy π_behav, as with
    runner.max_staleness > 0. Both choices take PPO's ratio r = π_θ / π_prox against the proximal policy π_prox (the
    actor's weights at the start of this update) and weigh each sample's clipped surrogate by a detached importance
    weight w from π_prox / π_behav: loss = mean(w * max(-A * r, -A * clip(r, 1 - low, 1 + high))).
    `decoupled`: AReaL's decoupled PPO (Fu et al. 2025; Hilton et al. 2021, "Batch size-invariance for policy
    optimization"), w = π_prox / π_behav; with behaviour_weight_cap, samples whose w exceeds the cap are dropped
    (w = 0, still counted in the mean), as AReaL's behav_imp_weight_cap does.
    `truncated_is`: truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"; the truncation of IMPALA and ACER), w = min(π_prox / π_behav, behaviour_weight_cap):
    every sample is kept, its weight clamped; the cap is required.
    Without behaviour log-probs (synchronous training) π_behav = π_prox, w = 1 and both are plain PPO."""
    behaviour_weight_cap: float | None = None
    """The bound on the importance weight w of off_policy_correction: null (no bound; `decoupled` only) or at least 1,
    so that on-policy samples (w = 1) always pass unchanged."""

    def __post_init__(self) -> None:
        check(self.group_size >= 1, "algorithm.group_size", self.group_size, "at least 1")
        check(0 <= self.gamma <= 1, "algorithm.gamma", self.gamma, "in [0, 1] (a discount factor)")
        check(0 <= self.gae_lambda <= 1, "algorithm.gae_lambda", self.gae_lambda, "in [0, 1]")
        check(self.lr > 0, "algorithm.lr", self.lr, "positive")
        check_choice("algorithm.lr_decay", self.lr_decay, LR_DECAYS)
        check(self.lr_warmup_steps >= 0, "algorithm.lr_warmup_steps", self.lr_warmup_steps, "0 (none) or more steps")
        check(0 <= self.min_lr_ratio <= 1, "algorithm.min_lr_ratio", self.min_lr_ratio, "in [0, 1]")
        check(self.update_epochs >= 1, "algorithm.update_epochs", self.update_epochs, "at least 1")
        check(self.num_minibatches >= 1, "algorithm.num_minibatches", self.num_minibatches, "at least 1")
        check(
            0 < self.clip_ratio_low <= 1,
            "algorithm.clip_ratio_low",
            self.clip_ratio_low,
            "in (0, 1] (the ratio's lower clip bound 1 - clip_ratio_low must not be negative)",
        )
        check(self.clip_ratio_high > 0, "algorithm.clip_ratio_high", self.clip_ratio_high, "positive")
        check(self.vf_coef >= 0, "algorithm.vf_coef", self.vf_coef, "0 or more (a negative weight unlearns the critic)")
        check(
            self.ent_coef >= 0, "algorithm.ent_coef", self.ent_coef, "0 or more (a negative weight punishes exploring)"
        )
        check(
            self.max_grad_norm > 0,
            "algorithm.max_grad_norm",
            self.max_grad_norm,
            "positive (gradients are scaled to at most this norm; a negative one reverses them)",
        )
        check_choice("algorithm.off_policy_correction", self.off_policy_correction, ("decoupled", "truncated_is"))
        check(
            self.behaviour_weight_cap is None or self.behaviour_weight_cap >= 1.0,
            "algorithm.behaviour_weight_cap",
            self.behaviour_weight_cap,
            "null or at least 1 (on-policy samples have weight 1 and must pass unchanged)",
        )
        check(
            self.off_policy_correction != "truncated_is" or self.behaviour_weight_cap is not None,
            "algorithm.behaviour_weight_cap",
            self.behaviour_weight_cap,
            "a number of at least 1 with off_policy_correction=truncated_is, which clamps the weight at it",
        )

    @property
    def value_clip(self) -> float | None:
        """The critic's clip range, or None when clip_vloss is off."""
        return self.clip_ratio_low if self.clip_vloss else None


@dataclass
class WeightSyncConfig:
    """How the actor's weights reach the rollout."""

    bucket_mb: float = 64.0
    """Weights travel in buckets of about this many MB."""

    def __post_init__(self) -> None:
        check(self.bucket_mb > 0, "weight_sync.bucket_mb", self.bucket_mb, "positive")


@dataclass
class RunnerConfig:
    """The training loop."""

    max_steps: int = 150
    """Training steps (each: sync weights, generate, advantages, train, record)."""
    max_epochs: int | None = None
    """Reasoning tasks that read data files: train this many passes over the training records instead, so
    max_steps = ceil(max_epochs x records / task.prompts_per_step), whatever max_steps says (verl's total_epochs,
    RLinf's max_epochs); null: max_steps decides."""
    seed: int = 1
    save_interval: int | None = 10
    """Checkpoint every this many steps (and at the end, and when SIGTERM or Ctrl-C stops the run); 0 saves only at
    the end; null never (benchmark and profiling runs, whose checkpoints of a large model would cost minutes and
    tens of GB)."""
    keep_checkpoints: int | None = None
    """Keep only the newest this many checkpoints of the run folder, removing older ones once a newer one is complete
    (an LLM's weights and optimizer state are tens of GB each), and later ones a resumed run supersedes
    (`checkpoint.prune`); null keeps every one."""
    resume: str | None = None
    """None starts fresh; `auto` continues the newest checkpoint of the run folder (an error if there is none);
    `auto_or_new` starts fresh then; or a checkpoint path."""
    hang_timeout_s: float = 900.0
    """Deadline of every phase call on the workers: a worker that has not answered by then is reported by group,
    rank and method and the run is torn down (exit 1). Generous: a step should take a fraction of it."""
    stop_when_solved: bool = True
    """Stop before max_steps once the last 20 episodes reach task.solved_return (embodied tasks)."""
    eval_interval: int = 10
    """Reasoning tasks: steps between evaluations on the held-out split (also after the last step)."""
    eval_before_train: bool = True
    """Reasoning tasks: evaluate before the first step too (verl's `val_before_train`); false saves that evaluation's
    time at the start, and the run reports no accuracy before training."""
    val_only: bool = False
    """Reasoning tasks: evaluate the starting policy (the model, or the checkpoint of runner.resume) on the held-out
    split and stop (verl's `val_only`): no training step, no checkpoint, no final model."""
    max_staleness: int = 0
    """K: the rollouts of step t are generated with policy version max(0, t - K), exactly, so the numbers depend on
    the seed and K, never on placement or timing. 0 is the synchronous loop; K >= 1 lets generation run K steps
    ahead of training, overlapping it where the actor has devices of its own (both task families)."""
    profile: bool = False
    """After the last step (and its checkpoint), write the run folder's profile.json: the measured costs from which
    `rlplace-plan plan.profile=<run folder>` predicts the step time of other placements. Embodied runs time each
    component's unit of work at several sizes, one component at a time on an otherwise idle cluster; reasoning runs
    read their units from the timeline and time the actor's passes at several sizes (`reasoning.profile`)."""
    replace_at: list[str] = field(default_factory=list)
    """Re-place the running job: `STEP:PRESET` entries (`'runner.replace_at=[4:disaggregated]'`). After STEP steps
    the run checkpoints, stops its workers, reserves the placement preset's devices in the same Ray session, starts
    the workers there from the checkpoint and goes on with the next step, its metrics unchanged."""
    replan_interval: int | None = None
    """Every this many steps, ask the planner (from `plan.profile`, or placement=auto's) whether another placement
    would finish the run sooner by more than `replan_margin` times what a switch costs, and move there if so."""
    replan_margin: float = 2.0
    """How many times a switch's measured cost the predicted time saved must exceed."""

    def __post_init__(self) -> None:
        check(self.max_steps >= 1, "runner.max_steps", self.max_steps, "at least 1 (a run with no step trains nothing)")
        check(
            self.max_epochs is None or self.max_epochs >= 1, "runner.max_epochs", self.max_epochs, "null or at least 1"
        )
        check(self.seed >= 0, "runner.seed", self.seed, "0 or more (numpy and gymnasium take no negative seed)")
        check(
            self.save_interval is None or self.save_interval >= 0,
            "runner.save_interval",
            self.save_interval,
            "0 (only at the end), more, or null (never)",
        )
        check(
            self.keep_checkpoints is None or self.keep_checkpoints >= 1,
            "runner.keep_checkpoints",
            self.keep_checkpoints,
            "at least 1, or null (keep every one)",
        )
        check(self.eval_interval >= 1, "runner.eval_interval", self.eval_interval, "at least 1")
        check(self.hang_timeout_s > 0, "runner.hang_timeout_s", self.hang_timeout_s, "positive")
        check(self.max_staleness >= 0, "runner.max_staleness", self.max_staleness, "0 (synchronous) or more")
        self.switches()  # refused here, naming the entry
        check(
            self.replan_interval is None or self.replan_interval >= 1,
            "runner.replan_interval",
            self.replan_interval,
            "null (off) or at least 1",
        )
        check(self.replan_margin > 0, "runner.replan_margin", self.replan_margin, "positive")
        for key, value, trains in (("profile", self.profile, "times"), ("replace_at", self.replace_at, "moves")):
            check(
                not (self.val_only and value),
                f"runner.{key}",
                value,
                f"unset with runner.val_only (it {trains} training steps, and a val_only run trains none)",
            )

    def switches(self) -> dict[int, str]:
        """`replace_at` as step -> placement preset, in step order (ConfigError for an entry that is not one)."""
        found: dict[int, str] = {}
        valid = f"STEP:PRESET entries, each STEP once, between 1 and runner.max_steps - 1 = {self.max_steps - 1}"
        for entry in self.replace_at:
            step, _, preset = str(entry).partition(":")
            ok = step.strip().isdigit() and bool(preset.strip()) and 0 < int(step) < self.max_steps
            check(ok and int(step) not in found, "runner.replace_at", list(self.replace_at), valid)
            found[int(step)] = preset.strip()
        return dict(sorted(found.items()))


@dataclass
class WandbConfig:
    project: str = "rlplace"
    mode: str = "offline"
    """`offline` (default; upload later with `wandb sync`), `online` or `disabled`."""
    group: str | None = None
    """Runs of one sweep share a group; None uses the run name."""
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_choice("logger.wandb.mode", self.mode, ("offline", "online", "disabled"))


@dataclass
class LoggerConfig:
    backend: str = "wandb"
    """A tracker of `rlplace.metrics.logger.BACKENDS` (`wandb`, `jsonl`, `none`); metrics.jsonl is written in the run
    folder in every case."""
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        check_choice("logger.backend", self.backend, LOGGER_BACKENDS)


@dataclass
class PlanConfig:
    format: str = "table"
    """How rlplace-plan prints the resolved placement: `table` or `json`."""
    profile: str | None = None
    """A run folder trained with `runner.profile=true`: rlplace-plan then predicts this run's step time."""
    search: bool = False
    """With `profile`: also rank every placement, stage count and staleness the cluster can run, fastest first."""
    top: int = 5
    """How many candidates a search prints."""
    auto: bool = False
    """Set by `placement=auto`: the run takes the placement and stage count the planner predicts fastest from
    `plan.profile` (at the run's own runner.max_staleness, which changes what is trained)."""

    def __post_init__(self) -> None:
        check_choice("plan.format", self.format, ("table", "json"))
        check(self.top >= 1, "plan.top", self.top, "at least 1")
        check(not self.search or self.profile is not None, "plan.search", self.search, "true only with plan.profile")
        check(
            not self.auto or self.profile is not None,
            "placement",
            "auto",
            "placement=auto with plan.profile=<the folder of a run trained with runner.profile=true> (rlplace-train "
            "profiles a short run first when none is given), or a placement preset (collocated, disaggregated, hybrid)",
        )


@dataclass
class RunConfig:
    """The sections every run has; a family's config (its `config.py`) adds its own."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)


@dataclass
class TrainSchema(RunConfig):
    """Hydra's primary schema (`train_schema` in rlplace/conf/train.yaml): the shared sections typed here, the family
    sections typed by the schema their option file starts from; `actor`, `env` and `inference` are set by placement
    presets, and `reward`, `actor` and `inference` (reasoning runs) by their config groups."""

    task: Any = MISSING
    model: Any = MISSING
    algorithm: Any = MISSING
    rollout: Any = MISSING
    actor: Any = None
    env: Any = None
    inference: Any = None
    reward: Any = None


def devices_resolver(lo: Any, hi: Any, *, _root_: DictConfig) -> str:
    """`${devices:LO,HI}`: the devices in fractions [LO, HI) of the cluster, as a range such as `0-3`.

    Placement presets use it so that one preset scales with the chosen cluster: `${devices:0,1/2}` is `0-3` on
    8 devices and `0` on 2. A cluster too small for the preset gets a clear error instead of an empty range.
    """
    nodes, per_node = int(_root_.cluster.num_nodes), int(_root_.cluster.num_devices_per_node)
    check(nodes >= 1, "cluster.num_nodes", nodes, "at least 1")
    check(per_node >= 1, "cluster.num_devices_per_node", per_node, "at least 1")
    num_devices = nodes * per_node
    start = math.floor(Fraction(str(lo)) * num_devices)
    stop = math.floor(Fraction(str(hi)) * num_devices)
    if stop <= start:
        raise ConfigError(
            f"this placement preset asks for devices [{lo}, {hi}) of the cluster, an empty share of its "
            f"{num_devices} device(s); choose a cluster with more devices or another placement"
        )
    return str(start) if stop - start == 1 else f"{start}-{stop - 1}"


def options_of(group: str, schemas: Iterable[str]) -> list[str]:
    """The options of config group `group` whose file starts from one of `schemas` (`/schema/<group>/<name>`), or from
    another option of the group that does (`defaults: [grpo, _self_]`), for error messages."""
    markers = [f"/schema/{group}/{name}@" for name in schemas]
    files = {p.stem: p.read_text() for p in (CONF_DIR / group).glob("*.yaml")}

    def starts_from_schema(name: str) -> bool:
        if any(marker in files[name] for marker in markers):
            return True
        defaults = OmegaConf.create(files[name]).get("defaults", [])
        return any(isinstance(entry, str) and entry in files and starts_from_schema(entry) for entry in defaults)

    return sorted(name for name in files if starts_from_schema(name))


def _config_store() -> Any:
    """Hydra's ConfigStore, imported only where configs are composed: worker processes unpickle these dataclasses
    but never compose, and importing Hydra would lengthen the start of each of them."""
    from hydra.core.config_store import ConfigStore

    return ConfigStore.instance()


def register_schema(group: str, name: str, node: type) -> None:
    """Store a family's base dataclass for option files of `group` to start from (`/schema/<group>/<name>`)."""
    _store(node, name, group=f"schema/{group}")


def _store(node: type, name: str, group: str | None = None) -> None:
    """Store a dataclass in Hydra's ConfigStore under `group`/`name`, unless that very dataclass is there already:
    storing converts it to an OmegaConf node, which every composition (`register` runs before each) would otherwise
    pay for again."""
    store = _config_store()
    stored = store.repo
    for part in group.split("/") if group else ():
        stored = stored.get(part, {})
    existing = stored.get(f"{name}.yaml")
    if existing is None or OmegaConf.get_type(existing.node) is not node:
        store.store(group=group, name=name, node=node)


def packaged_data(relative: str) -> str:
    """`${packaged_data:word_problems/train.jsonl}`: the path of a data file shipped inside the package (rlplace/data),
    so that a preset names it wherever the package is installed."""
    return str(Path(__file__).resolve().parents[1] / "data" / relative)


def register() -> None:
    """Register the primary schema and the `devices` and `packaged_data` resolvers with Hydra and OmegaConf
    (idempotent)."""
    _store(TrainSchema, "train_schema")
    for name, resolver in (("devices", devices_resolver), ("packaged_data", packaged_data)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


def to_typed(cfg: DictConfig, schema: type[T], family: str) -> T:
    """Resolve interpolations and build `schema` (a family's config dataclass), running every section's checks.

    A section the family does not have (set by a preset of the other family) and errors raised while resolving or
    merging are re-raised as ConfigError naming the key, so callers have one exception type to report.
    """
    from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

    names = [f.name for f in fields(schema)]  # type: ignore[arg-type]
    raw = OmegaConf.to_container(cfg, resolve=False)
    for key, value in raw.items():
        if key not in names and value not in (None, MISSING):
            raise ConfigError(
                f"{key} = {value!r}: this {family} run has no {key} section (valid sections: {', '.join(names)}); "
                f"is a preset of the other task family selected?"
            )
    # A section left null (`actor`, `env`: set only by placement presets) keeps the schema's defaults; merging the
    # null would fail with "field 'env' is not Optional" instead of naming what is wrong.
    present = [name for name in names if raw.get(name) is not None]
    for name in present:
        _refuse_unknown_keys(cfg[name], name)
    try:
        base = OmegaConf.structured(schema)
        for name in present:
            # A section typed by an extension of the schema's dataclass (a task's own schema: schema per option)
            # starts from that extension's defaults, so that its own fields merge.
            node_type = OmegaConf.get_type(cfg, name)
            if is_dataclass(node_type) and node_type is not OmegaConf.get_type(base, name):
                base[name] = OmegaConf.structured(node_type)
        typed = OmegaConf.to_object(OmegaConf.merge(base, OmegaConf.masked_copy(cfg, present)))
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} is missing: this option needs a value ({err.full_key}=...)") from err
    except InterpolationResolutionError as err:
        reason = err.msg.splitlines()[0].removeprefix(f"{ConfigError.__name__} raised while resolving interpolation: ")
        raise ConfigError(f"{err.full_key}: {reason}") from err
    except OmegaConfBaseException as err:
        raise ConfigError(f"{err.full_key}: {str(err).splitlines()[0]}") from err
    assert isinstance(typed, schema)
    return typed


def _refuse_unknown_keys(node: Any, key: str) -> None:
    """ConfigError naming the first key of `node` (and of its typed sub-sections) that its schema lacks.

    Hydra refuses `task.foo=1` while composing, but a `+task.foo=1` override adds the key to the typed section, and
    merging into the schema would silently drop it: a misspelt option must not be ignored."""
    if not isinstance(node, DictConfig):
        return
    node_type = OmegaConf.get_type(node)
    known = {f.name for f in fields(node_type)} if is_dataclass(node_type) else None
    for child in node.keys():
        if known is not None and child not in known:
            raise ConfigError(
                f"{key}.{child} = {OmegaConf.to_container(node, resolve=False)[child]!r}: {node_type.__name__} has no "
                f"key {child!r} (valid: {', '.join(sorted(known))})"
            )
        _refuse_unknown_keys(node._get_node(child), f"{key}.{child}")
