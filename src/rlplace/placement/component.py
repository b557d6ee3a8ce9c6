"""Component placement: the whole `cluster.component_placement` mapping, parsed and checked up front.

This is the user-facing object (RLinf's `HybridComponentPlacement` / `ModelParallelComponentPlacement` flow): it
turns the config into one strategy per component, derives the mode (collocated, disaggregated, hybrid) that the
runner uses to decide between offload/onload and overlap, and refuses a bad config before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import PlacementError
from .grammar import (
    CONFIG_PATH,
    DeviceValue,
    NodeValue,
    ParsedValue,
    describe,
    format_ranks,
    parse_component_key,
    parse_value,
    plain,
)
from .placement import Placement
from .strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)

KNOWN_COMPONENTS: tuple[str, ...] = ("env", "rollout", "actor", "inference", "reference", "reward", "critic")
"""Every component name a runner knows; any other key in `cluster.component_placement` is refused."""

Mode = Literal["collocated", "disaggregated", "hybrid"]


@dataclass(frozen=True)
class _Entry:
    """One placed component: where it came from in the config and what it resolved to."""

    key: str
    value: Any
    strategy: PlacementStrategy
    placements: tuple[Placement, ...]


def strategy_for_processes(process_devices: Sequence[Sequence[int]]) -> PlacementStrategy:
    """The simplest strategy for explicit per-process devices: packed when contiguous and even, else flexible."""
    processes = [tuple(devices) for devices in process_devices]
    size = len(processes[0])
    flat = [device for devices in processes for device in devices]
    start, end = flat[0], flat[-1]
    if all(len(devices) == size for devices in processes) and flat == list(range(start, end + 1)):
        return PackedPlacementStrategy(start, end, num_devices_per_process=size)
    return FlexiblePlacementStrategy(processes)


class ComponentPlacement:
    """Where every component runs, parsed from `cluster.component_placement` and validated against the cluster.

    Args:
        component_placement: mapping from component key (`"actor"` or `"actor,rollout"`) to a placement value.
        num_nodes: nodes in the cluster.
        num_devices_per_node: devices per node; global device ranks are node-major.
        required: components the runner needs; leaving one unplaced is an error.
    """

    def __init__(
        self,
        component_placement: Mapping[str, Any],
        num_nodes: int,
        num_devices_per_node: int,
        required: Sequence[str] = (),
    ) -> None:
        for name, value, minimum in (("num_nodes", num_nodes, 1), ("num_devices_per_node", num_devices_per_node, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise PlacementError(f"cluster.{name} = {value!r}: must be an integer >= {minimum}")
        if not isinstance(component_placement, Mapping):
            raise PlacementError(
                f"{CONFIG_PATH} = {component_placement!r}: must be a mapping from component names to placements, "
                "e.g. {actor: all, env: '0-3'}"
            )
        self._num_nodes = num_nodes
        self._num_devices_per_node = num_devices_per_node
        self._entries: dict[str, _Entry] = {}

        for key, value in component_placement.items():
            if value is None:
                continue  # `key: null` removes a key a preset set (Hydra merges mappings; it cannot delete keys)
            names = parse_component_key(key)
            for name in names:
                if name not in KNOWN_COMPONENTS:
                    raise PlacementError(
                        f"{describe(key, value)}: unknown component {name!r} (valid: {', '.join(KNOWN_COMPONENTS)})"
                    )
                if name in self._entries:
                    raise PlacementError(
                        f"{describe(key, value)}: component {name!r} is already placed by key "
                        f"{self._entries[name].key!r}; place each component once"
                    )
            parsed = parse_value(key, value, num_nodes, num_devices_per_node)
            for name in names:
                strategy = self._make_strategy(name, key, value, parsed)
                try:
                    placements = strategy.get_placements(num_nodes, num_devices_per_node)
                except PlacementError as error:
                    raise PlacementError(f"{describe(key, value)}: {error}") from None
                self._entries[name] = _Entry(key, plain(value), strategy, tuple(placements))

        missing = [name for name in required if name not in self._entries]
        if missing:
            raise PlacementError(
                f"{CONFIG_PATH}: required component(s) {', '.join(missing)} not placed "
                f"(placed: {', '.join(self._entries) or 'none'}); add e.g. {CONFIG_PATH}.{missing[0]}=all"
            )

    def _make_strategy(self, name: str, key: str, value: Any, parsed: ParsedValue) -> PlacementStrategy:
        """The strategy for one component of an entry; subclasses override to regroup devices (model parallel)."""
        if isinstance(parsed, NodeValue):
            return NodePlacementStrategy(parsed.process_nodes)
        return strategy_for_processes(parsed.process_devices)

    # ------------------------------------------------------------------ queries

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    @property
    def num_devices_per_node(self) -> int:
        return self._num_devices_per_node

    @property
    def num_devices(self) -> int:
        """Devices in the whole cluster (the budget every mode is measured against)."""
        return self._num_nodes * self._num_devices_per_node

    @property
    def components(self) -> list[str]:
        """Placed component names, in config order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise PlacementError(
                f"component {name!r} is not placed (placed: {', '.join(self._entries) or 'none'}); "
                f"set {CONFIG_PATH}.{name}"
            ) from None

    def get_strategy(self, name: str) -> PlacementStrategy:
        """The strategy to launch component `name` with."""
        return self._entry(name).strategy

    def get_placements(self, name: str) -> list[Placement]:
        """One `Placement` per process of component `name`, in rank order."""
        return list(self._entry(name).placements)

    def get_world_size(self, name: str) -> int:
        """Number of processes of component `name`."""
        return len(self._entry(name).placements)

    def devices_of(self, name: str) -> list[int]:
        """Sorted global device ranks used by component `name` (empty for a node-group component)."""
        return sorted({device for p in self._entry(name).placements for device in p.devices})

    def device_sharing(self) -> dict[int, list[str]]:
        """Every device of the cluster -> the components on it (config order), possibly none."""
        sharing: dict[int, list[str]] = {device: [] for device in range(self.num_devices)}
        for name in self._entries:
            for device in self.devices_of(name):
                sharing[device].append(name)
        return sharing

    @property
    def mode(self) -> Mode:
        """`collocated` if all device-holding components use the same devices, `disaggregated` if pairwise
        disjoint, `hybrid` otherwise. Node-group components hold no devices and are ignored."""
        device_sets = [frozenset(self.devices_of(name)) for name in self._entries]
        device_sets = [devices for devices in device_sets if devices]
        if len(set(device_sets)) <= 1:
            return "collocated"
        if sum(len(devices) for devices in device_sets) == len(frozenset().union(*device_sets)):
            return "disaggregated"
        return "hybrid"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: `{"mode", "num_devices", "components": {name: [{"rank", "node", "devices"}]}}`."""
        return {
            "mode": self.mode,
            "num_devices": self.num_devices,
            "components": {
                name: [{"rank": p.rank, "node": p.node_rank, "devices": list(p.devices)} for p in entry.placements]
                for name, entry in self._entries.items()
            },
        }

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={format_ranks(self.devices_of(name))}" for name in self._entries)
        return f"{type(self).__name__}(mode={self.mode}, nodes={self._num_nodes}x{self._num_devices_per_node}, {parts})"


# ---------------------------------------------------------------------- config-driven placements


def _get(obj: Any, path: str) -> Any:
    """Read `a.b.c` from a DictConfig or dataclass config, refusing a missing field with its full path."""
    value = obj
    for name in path.split("."):
        value = getattr(value, name, None) if value is not None else None
        if value is None:
            raise PlacementError(f"cfg.{path} is missing; the placement needs it")
    return value


def _cluster_shape(cfg: Any, cluster: Any | None) -> tuple[Mapping[str, Any], int, int]:
    """`component_placement` from the config; the shape from the live cluster if given, else from the config."""
    component_placement = _get(cfg, "cluster.component_placement")
    source, prefix = (cluster, "cluster") if cluster is not None else (cfg.cluster, "cfg.cluster")
    shape = []
    for name in ("num_nodes", "num_devices_per_node"):
        value = getattr(source, name, None)
        if value is None:
            raise PlacementError(f"{prefix}.{name} is missing; the placement needs the cluster shape")
        shape.append(value)
    return component_placement, shape[0], shape[1]


class HybridComponentPlacement(ComponentPlacement):
    """Placement for embodied RL (env, rollout, actor), RLinf-style: built from the run config.

    `cluster`, if given (the live cluster object; duck-typed), overrides the shape in `cfg.cluster` with its
    `num_nodes` and `num_devices_per_node`.
    """

    REQUIRED: tuple[str, ...] = ("actor", "env", "rollout")

    def __init__(self, cfg: Any, cluster: Any | None = None) -> None:
        component_placement, num_nodes, num_devices_per_node = _cluster_shape(cfg, cluster)
        super().__init__(component_placement, num_nodes, num_devices_per_node, required=self.REQUIRED)


def _tensor_parallel_size(cfg: Any, component: str) -> int:
    section = getattr(cfg, component, None)
    value = getattr(section, "tensor_parallel_size", None) if section is not None else None
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlacementError(f"cfg.{component}.tensor_parallel_size = {value!r}: must be an integer >= 1")
    return value


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


class ModelParallelComponentPlacement(ComponentPlacement):
    """Placement for LLM tasks: each rollout (actor) process owns `tensor_parallel_size` contiguous devices.

    A rollout value of `"0-7"` with `cfg.rollout.tensor_parallel_size = 2` gives 4 rollout processes of 2 devices.
    A shared key such as `"actor,rollout"` shares the devices; each component still groups them by its own TP size.
    When actor and rollout are collocated, the rollout TP size must divide the actor TP size.
    """

    REQUIRED: tuple[str, ...] = ("actor", "rollout")

    def __init__(self, cfg: Any, cluster: Any | None = None) -> None:
        self._tp_sizes = {name: _tensor_parallel_size(cfg, name) for name in ("actor", "rollout")}
        component_placement, num_nodes, num_devices_per_node = _cluster_shape(cfg, cluster)
        super().__init__(component_placement, num_nodes, num_devices_per_node, required=self.REQUIRED)

        rollout_devices = self.devices_of("rollout")
        if rollout_devices == self.devices_of("actor") and self.actor_tp_size % self.rollout_tp_size:
            entry = self._entries["rollout"]
            raise PlacementError(
                f"{describe(entry.key, entry.value)}: rollout is collocated with actor on devices "
                f"{format_ranks(rollout_devices)}, so rollout.tensor_parallel_size ({self.rollout_tp_size}) must "
                f"divide actor.tensor_parallel_size ({self.actor_tp_size}) (valid: {_divisors(self.actor_tp_size)})"
            )

    @property
    def rollout_tp_size(self) -> int:
        return self._tp_sizes["rollout"]

    @property
    def actor_tp_size(self) -> int:
        return self._tp_sizes["actor"]

    def _make_strategy(self, name: str, key: str, value: Any, parsed: ParsedValue) -> PlacementStrategy:
        tp = self._tp_sizes.get(name)
        if tp is None:
            return super()._make_strategy(name, key, value, parsed)
        if not isinstance(parsed, DeviceValue):
            raise PlacementError(f"{describe(key, value)}: {name} needs devices; a node-group value holds none")
        if parsed.explicit_processes:
            sizes = {len(devices) for devices in parsed.process_devices}
            if sizes != {tp} or len(set(parsed.process_devices)) != len(parsed.process_devices):
                raise PlacementError(
                    f"{describe(key, value)}: each {name} process must own exactly {name}.tensor_parallel_size = {tp} "
                    f"device(s) of its own; give the devices alone (e.g. '{format_ranks(parsed.devices)}') and "
                    f"they are grouped by {tp}"
                )
            return strategy_for_processes(parsed.process_devices)
        devices = parsed.devices
        if len(devices) % tp:
            raise PlacementError(
                f"{describe(key, value)}: {name}.tensor_parallel_size = {tp} does not divide its {len(devices)} "
                f"device(s) (valid tensor_parallel_size: {_divisors(len(devices))})"
            )
        return strategy_for_processes([devices[i : i + tp] for i in range(0, len(devices), tp)])
