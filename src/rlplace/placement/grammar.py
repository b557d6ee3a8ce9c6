"""Parsing of `cluster.component_placement` keys and values, independent of any component semantics.

Keeping the grammar separate from `ComponentPlacement` means every value form (`all`, `3`, `"0-3,5"`,
`"0-3:0-7"`, `{node_group: node, placement: "0:0-7"}`) is turned into one explicit list of processes in one place,
and every syntax or range error is reported the same way: `cluster.component_placement.<key> = <value>: <problem>`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import PlacementError

CONFIG_PATH = "cluster.component_placement"
NODE_GROUP = "node"
"""The only `node_group` value understood: processes placed on nodes rather than devices."""

_INT = re.compile(r"^\d+$")
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")
_VALUE_FORMS = (
    "expected 'all', a device rank like 3, a list '0,2,3', ranges '0-3,5,7', 'devices:processes' like '0-3:0-7', "
    "or {node_group: node, placement: 'nodes:processes'}"
)


@dataclass(frozen=True)
class DeviceValue:
    """A value that places processes on devices.

    `process_devices[i]` are the global device ranks of process i. `explicit_processes` is True when the value used
    the `devices:processes` form, False when it listed devices only (one process per device).
    """

    devices: tuple[int, ...]
    process_devices: tuple[tuple[int, ...], ...]
    explicit_processes: bool


@dataclass(frozen=True)
class NodeValue:
    """A node-group value: `process_nodes[i]` is the node rank of process i; the processes hold no devices."""

    process_nodes: tuple[int, ...]


ParsedValue = DeviceValue | NodeValue


class _Problem(Exception):
    """Raised by the helpers below; `parse_value` adds the key and value and re-raises as PlacementError."""


def format_ranks(ranks: Sequence[int]) -> str:
    """Write ranks compactly, e.g. [0, 1, 2, 3, 5] -> '0-3,5'; an empty list -> 'none'."""
    parts: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts) if parts else "none"


def plain(value: Any) -> Any:
    """A plain-Python copy of a config value (OmegaConf mappings become dicts) for parsing and error messages."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def describe(key: str, value: Any) -> str:
    """The prefix of every error message about one entry, e.g. `cluster.component_placement.env = '0-9'`."""
    return f"{CONFIG_PATH}.{key} = {plain(value)!r}"


def parse_component_key(key: Any) -> tuple[str, ...]:
    """Split a key such as `"actor, rollout"` into component names, refusing empty or repeated names."""
    if not isinstance(key, str):
        raise PlacementError(
            f"{CONFIG_PATH}: key {key!r} is not a string; expected component names like 'actor,rollout'"
        )
    names = tuple(name.strip() for name in key.split(","))
    if any(not name for name in names):
        raise PlacementError(
            f"{CONFIG_PATH}: key {key!r} has an empty component name; expected names separated by commas, "
            "like 'actor,rollout'"
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise PlacementError(f"{CONFIG_PATH}: key {key!r} names {', '.join(repeated)} more than once")
    return names


def parse_value(key: str, value: Any, num_nodes: int, num_devices_per_node: int) -> ParsedValue:
    """Parse one `component_placement` value against the cluster shape into explicit processes."""
    value = plain(value)
    try:
        if isinstance(value, Mapping):
            return _parse_node_group(value, num_nodes)
        return _parse_devices(value, num_nodes * num_devices_per_node, num_devices_per_node)
    except _Problem as problem:
        raise PlacementError(f"{describe(key, value)}: {problem}") from None


def _text(value: Any, what: str) -> str:
    """Normalise an int-or-string value to stripped text, refusing other types and empty values."""
    if value is None:
        raise _Problem(f"the value is empty; {_VALUE_FORMS}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _Problem(f"a {what} must be an integer or a string, not {type(value).__name__}; {_VALUE_FORMS}")
    text = str(value).strip()
    if not text:
        raise _Problem(f"the value is empty; {_VALUE_FORMS}")
    return text


def _parse_devices(value: Any, num_devices: int, num_devices_per_node: int) -> DeviceValue:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise _Problem(_out_of_range("device", value, num_devices))
    text = _text(value, "placement value")
    device_text, process_text = _split_colon(text)
    devices = sorted(_parse_ranks(device_text, limit=num_devices, noun="device", allow_all=True))
    if process_text is None:
        return DeviceValue(tuple(devices), tuple((d,) for d in devices), explicit_processes=False)

    num_processes = _parse_process_count(process_text)
    num = len(devices)
    if num_processes >= num and num_processes % num == 0:
        per_device = num_processes // num
        process_devices = tuple((devices[p // per_device],) for p in range(num_processes))
    elif num_processes < num and num % num_processes == 0:
        per_process = num // num_processes
        process_devices = tuple(tuple(devices[p * per_process : (p + 1) * per_process]) for p in range(num_processes))
    else:
        raise _Problem(
            f"{num} devices and {num_processes} processes: one count must divide the other "
            f"(valid process counts: {_divisors_and_multiples(num)})"
        )
    return DeviceValue(tuple(devices), process_devices, explicit_processes=True)


def _parse_node_group(value: Mapping[str, Any], num_nodes: int) -> NodeValue:
    unknown = sorted(set(value) - {"node_group", "placement"})
    if unknown:
        raise _Problem(
            f"unknown field(s) {', '.join(unknown)}; a node-group value has exactly node_group and placement"
        )
    if value.get("node_group") != NODE_GROUP:
        raise _Problem(f"node_group must be {NODE_GROUP!r} (CPU-only processes placed on nodes)")
    if "placement" not in value:
        raise _Problem("placement is missing; expected 'nodes:processes', e.g. '0:0-7'")
    text = _text(value["placement"], "node-group placement")
    node_text, process_text = _split_colon(text)
    nodes = sorted(_parse_ranks(node_text, limit=num_nodes, noun="node", allow_all=True))
    if process_text is None:
        return NodeValue(tuple(nodes))
    num_processes = _parse_process_count(process_text)
    if num_processes % len(nodes) != 0:
        raise _Problem(
            f"{num_processes} processes cannot be split evenly across {len(nodes)} node(s) "
            f"(valid process counts: multiples of {len(nodes)})"
        )
    per_node = num_processes // len(nodes)
    return NodeValue(tuple(nodes[p // per_node] for p in range(num_processes)))


def _split_colon(text: str) -> tuple[str, str | None]:
    parts = text.split(":")
    if len(parts) > 2:
        raise _Problem(f"more than one ':'; {_VALUE_FORMS}")
    if len(parts) == 1:
        return parts[0].strip(), None
    left, right = parts[0].strip(), parts[1].strip()
    if not left or not right:
        raise _Problem(f"both sides of ':' must be non-empty; {_VALUE_FORMS}")
    return left, right


def _parse_process_count(text: str) -> int:
    """Parse the process part of `devices:processes`; the ranks must be exactly 0..P-1."""
    if text == "all":
        raise _Problem("'all' is not valid for process ranks; write them as a range starting at 0, e.g. '0-7'")
    ranks = _parse_ranks(text, limit=None, noun="process", allow_all=False)
    if sorted(ranks) != list(range(len(ranks))):
        raise _Problem(
            f"process ranks must be contiguous from 0 (got {format_ranks(ranks)}; valid: 0-{len(ranks) - 1})"
            if len(ranks) > 1
            else f"process ranks must be contiguous from 0 (got {format_ranks(ranks)}; valid: 0)"
        )
    return len(ranks)


def _parse_ranks(text: str, limit: int | None, noun: str, allow_all: bool) -> list[int]:
    """Parse `all`, `3`, `0,2,3` or `0-3,5,7` into distinct ranks, checking each against `limit` (exclusive)."""
    if text == "all":
        if not allow_all or limit is None:
            raise _Problem(f"'all' is not valid for {noun} ranks")
        if limit == 0:
            raise _Problem(f"'all' selects no {noun}s: this cluster has none")
        return list(range(limit))
    ranks: list[int] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            raise _Problem(f"empty item in {text!r}; {_VALUE_FORMS}")
        if _INT.match(token):
            items = [int(token)]
        elif match := _RANGE.match(token):
            low, high = int(match.group(1)), int(match.group(2))
            if high < low:
                raise _Problem(f"range '{token}' is descending; write it as '{high}-{low}'")
            items = list(range(low, high + 1))
        else:
            raise _Problem(f"'{token}' is not a {noun} rank or range; {_VALUE_FORMS}")
        if limit is not None and items[-1] >= limit:
            raise _Problem(_out_of_range(noun, items[-1], limit))
        for rank in items:
            if rank in ranks:
                raise _Problem(f"{noun} {rank} is listed twice")
            ranks.append(rank)
    return ranks


def _out_of_range(noun: str, rank: int, limit: int) -> str:
    valid = format_ranks(range(limit))
    return f"{noun} {rank} is out of range; this cluster has {limit} {noun}s (valid: {valid})"


def _divisors_and_multiples(n: int) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(str(d) for d in divisors + [2 * n, 3 * n]) + ", ..."
