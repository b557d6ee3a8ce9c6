"""The placement layer's one exception.

A bad `cluster.component_placement` must fail before Ray starts, with a single line that names the config key, the
offending value and what would be valid. Subclassing `ValueError` keeps it catchable by generic config validation.
"""

from __future__ import annotations


class PlacementError(ValueError):
    """An invalid placement: a malformed value, a device outside the cluster, an unplaced component, ..."""
