"""Other runs' embedded Rays on this machine, found from Ray's session folders, without Ray.

Two runs that each start an embedded Ray on one machine both split the same cores between their devices, and
nothing queues them (runs on one shared Ray queue for its devices instead): both run slower and their timings are
not the placement's. The driver says so in one line at start (`train.train`).

Ray names the session folder of a Ray started by `ray.init` after the process that started it
(`<temp dir>/ray/session_<date>_<time>_<microseconds>_<pid>`), and its raylet is started with its socket in that
folder (`--raylet_socket_name=<folder>/sockets/raylet`). A session counts while that process lives and a raylet
names the folder: a SIGKILLed driver leaves its folder behind, and a driver that stopped its Ray removes it. Only
/proc is read: the other run's Ray is not contacted. Sessions of this process and of its ancestors (the Ray of a
Hydra Ray launcher multirun, whose worker runs this job) are the run's own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RaySession:
    folder: Path
    pid: int
    """The process that started this Ray."""
    command: str
    """That process's command line (empty where it cannot be read)."""

    @property
    def by_rlplace(self) -> bool:
        return "rlplace" in self.command


def ray_temp_dir() -> Path:
    """Where Ray keeps its session folders: Ray's own rule (RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    if "RAY_TMPDIR" in os.environ:
        return Path(os.environ["RAY_TMPDIR"], "ray")
    if sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        return Path(os.environ["TMPDIR"], "ray")
    return Path("/tmp/ray")


def other_embedded_rays(temp_dir: Path | None = None) -> list[RaySession]:
    """The live Ray sessions under `temp_dir` (Ray's temp folder) that neither this process nor an ancestor started,
    oldest first."""
    temp_dir = ray_temp_dir() if temp_dir is None else temp_dir
    own = _ancestors()
    raylets = _raylet_sessions()
    found = []
    for folder in sorted(temp_dir.glob("session_*_*")):
        pid = folder.name.rsplit("_", 1)[-1]
        if folder.is_symlink() or not pid.isdigit() or int(pid) in own:
            continue
        if _alive(int(pid)) and (raylets is None or folder.name in raylets):
            found.append(RaySession(folder, int(pid), _command(int(pid))))
    return found


def describe(sessions: list[RaySession]) -> str | None:
    """The one line a run starting its own Ray logs about `sessions`, or None if there are none."""
    if not sessions:
        return None
    runs = [s for s in sessions if s.by_rlplace]
    named = runs or sessions
    many = len(named) > 1
    pids = ", ".join(str(s.pid) for s in named)
    verb = "run" if many else "runs"
    what = (
        f"{len(named)} other rlplace run{'s' if many else ''} (pid {pids}) already {verb} an embedded Ray"
        if runs
        else f"{len(named)} other embedded Ray{'s' if many else ''} (started by pid {pids}) already {verb}"
    )
    return (
        f"rlplace: {what} on this machine: the runs share its cores and do not queue, so each is slower and its "
        "timings are not its placement's alone; to queue runs, start one Ray (`ray start --head`) and give each run "
        "cluster.address=auto"
    )


def _ancestors() -> set[int]:
    """This process and its ancestors, from /proc (just this process where /proc is missing)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state: the parent's pid
    return pids | {os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:  # a zombie has exited: it only waits for its parent to collect its status
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _raylet_sessions() -> set[str] | None:
    """The session folder names that running raylets were started for, from their command lines; None where /proc
    cannot be read (then a session counts while the process that started it lives)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    names = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile, or another user's
            continue
        for arg in command.split(b"\0"):
            if arg.startswith(b"--raylet_socket_name="):
                names.add(Path(arg.split(b"=", 1)[1].decode(errors="replace")).parent.parent.name)
    return names


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
