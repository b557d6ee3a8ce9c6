"""Component placement: the whole `cluster.component_placement` mapping, parsed and checked up front.

This is the user-facing object (RLinf's `HybridComponentPlacement` flow): it
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
        components: the components of the run's task family (its runner launches exactly these); leaving one
            unplaced, or naming any other, is an error.
    """

    def __init__(
        self,
        component_placement: Mapping[str, Any],
        num_nodes: int,
        num_devices_per_node: int,
        components: Sequence[str],
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
                if name not in components:
                    raise PlacementError(
                        f"{describe(key, value)}: unknown component {name!r} for this task (valid: "
                        f"{', '.join(components)}); remove it with {CONFIG_PATH}.{key}=null"
                    )
                if name in self._entries:
                    raise PlacementError(
                        f"{describe(key, value)}: component {name!r} is already placed by key "
                        f"{self._entries[name].key!r}; place each component once"
                    )
            parsed = parse_value(key, value, num_nodes, num_devices_per_node)
            for name in names:
                strategy = self._make_strategy(parsed)
                try:
                    placements = strategy.get_placements(num_nodes, num_devices_per_node)
                except PlacementError as error:
                    raise PlacementError(f"{describe(key, value)}: {error}") from None
                self._entries[name] = _Entry(key, plain(value), strategy, tuple(placements))

        missing = [name for name in components if name not in self._entries]
        if missing:
            raise PlacementError(
                f"{CONFIG_PATH}: required component(s) {', '.join(missing)} not placed "
                f"(placed: {', '.join(self._entries) or 'none'}); add e.g. {CONFIG_PATH}.{missing[0]}=all"
            )

    @staticmethod
    def _make_strategy(parsed: ParsedValue) -> PlacementStrategy:
        """The strategy for one component of an entry."""
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
    """The placement of a run, RLinf-style: built from the run config, whatever the mode.

    The components are the config's `components` (its task family's worker groups). `cluster`, if given (the live
    cluster object; duck-typed), overrides the shape in `cfg.cluster` with its `num_nodes` and
    `num_devices_per_node`.
    """

    def __init__(self, cfg: Any, cluster: Any | None = None) -> None:
        component_placement, num_nodes, num_devices_per_node = _cluster_shape(cfg, cluster)
        super().__init__(component_placement, num_nodes, num_devices_per_node, components=_get(cfg, "components"))
