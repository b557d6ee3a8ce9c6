"""Ray's temp folder, and removing the session folders a test's own Ray leaves there (Ray keeps every session's
folder forever; a Ray that rlplace's `Cluster` starts removes its own, one a test starts otherwise does not)."""

from __future__ import annotations

import os
from pathlib import Path

from rlplace.scheduler.session import remove_session

RAY_TEMP = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray")


def remove_sessions(pid: int) -> None:
    """Delete the session folders of the Rays that process `pid` started (Ray names a session after that pid)."""
    for session in RAY_TEMP.glob(f"session_*_{pid}"):
        remove_session(str(session))
