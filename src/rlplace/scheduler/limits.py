"""Sizes that choose a transfer's path, importable without torch or Ray: the planner models the same choice."""

from __future__ import annotations

SMALL_BYTES = 1 << 20
"""Largest tensor averaged through the mailboxes (`GroupMean`); larger ones take the group's all-reduce."""
