"""Placement: which devices and nodes each RL component runs on, as checked data. Pure Python, no Ray.

`cluster.component_placement` is parsed by `grammar`, turned into `strategies` by `component`, and each worker
process ends up with one `Placement` record. The scheduler launches from these; nothing here starts anything.
"""

from .component import ComponentPlacement, HybridComponentPlacement
from .errors import PlacementError
from .placement import Placement
from .strategies import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)

__all__ = [
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "HybridComponentPlacement",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementError",
    "PlacementStrategy",
]
