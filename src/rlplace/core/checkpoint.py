"""Checkpoint folders: written atomically, carrying a manifest, verified and found again for `runner.resume`.

A checkpoint is a folder `checkpoints/step_<k>` holding one file per writer (the driver's runner state, the actor's
weights and optimizer, the simulators' state). Writers fill `step_<k>.tmp`; when all are done the driver writes
`manifest.json` (each file's size and SHA-256) and renames the folder, so a run killed mid-save leaves the previous
checkpoint as the newest complete one. Before anything starts, a resume checks every file against the manifest: a
truncated or corrupted file is refused by name instead of failing half-way through loading.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlplace.core.errors import ConfigError

_COMPLETE = re.compile(r"^step_(\d+)$")
FOLDER = "checkpoints"
"""Where a run keeps its checkpoints, inside its run folder."""
STATE_FILE = "runner.json"
"""The driver's part of a checkpoint: the family, the step, the loop's counters, and the run's `identity`."""
MANIFEST = "manifest.json"
RESUME_AUTO = ("auto", "auto_or_new")
RESUME_CHOICES = "null (start fresh), auto (the newest checkpoint; error if none), auto_or_new, or a checkpoint path"


def staging_dir(root: Path, step: int) -> Path:
    """A fresh temporary folder for the checkpoint of `step`; writers put their files here."""
    tmp = root / f"step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(tmp: Path) -> Path:
    """Write the manifest of a filled staging folder and publish it under its final name (an atomic rename)."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    final = tmp.with_suffix("")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def verify(folder: Path, key: str = "runner.resume") -> None:
    """Check every file of the manifest: present, of its size, with its checksum; ConfigError naming `key`, the
    folder and the first file that is not, or the manifest itself when it is not one (hand-edited, or written by
    something else)."""
    where = f"{key} = {str(folder)!r}"
    for name, expected in _read_manifest(folder, where).items():
        path = folder / name
        if not path.is_file():
            raise ConfigError(f"{where}: {name} is missing")
        if path.stat().st_size != expected["bytes"]:
            size = path.stat().st_size
            raise ConfigError(f"{where}: {name} has {size} bytes, the manifest says {expected['bytes']} (truncated?)")
        if _sha256(path) != expected["sha256"]:
            raise ConfigError(f"{where}: {name} does not match its checksum in the manifest (corrupted)")


def _read_manifest(folder: Path, where: str) -> dict[str, dict[str, Any]]:
    """The manifest as `commit` writes it (file -> {"bytes": int, "sha256": str}), or ConfigError naming the
    manifest and what is wrong with it."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no {MANIFEST} (not an rlplace checkpoint, or written before manifests)") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: {MANIFEST} is unreadable ({err})") from err
    valid = 'valid: {"<file>": {"bytes": <int>, "sha256": "<hex>"}, ...}, as rlplace writes it'
    if not isinstance(manifest, dict) or not manifest:
        raise ConfigError(f"{where}: {MANIFEST} holds {_short(manifest)}, not a manifest of files ({valid})")
    for name, expected in manifest.items():
        if not (
            isinstance(expected, dict)
            and isinstance(expected.get("bytes"), int)
            and isinstance(expected.get("sha256"), str)
        ):
            what = f"{name!r}: {_short(expected)}, not its size and checksum"
            raise ConfigError(f"{where}: {MANIFEST} has {what} ({valid})")
    return manifest


def read_state(folder: Path, family: str, key: str = "runner.resume") -> dict[str, Any]:
    """The driver's STATE_FILE of checkpoint `folder`, refused (ConfigError, one line naming `key` and the file)
    unless a run of `family` wrote it: a JSON object with the step it was saved at and the run's `identity`. Checked
    before anything starts, so that a damaged file is not found half-way through resuming."""
    where = f"{key} = {str(folder)!r} is invalid"
    try:
        state = json.loads((folder / STATE_FILE).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: {STATE_FILE} is missing (not a checkpoint of the {family} family)") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"{where}: {STATE_FILE} is unreadable ({err})") from err
    if not isinstance(state, dict) or state.get("family") != family:
        raise ConfigError(f"{where}: not a checkpoint of the {family} family (no {family} state in its {STATE_FILE})")
    for key, kind in (("step", int), ("identity", dict)):
        if not isinstance(state.get(key), kind):
            raise ConfigError(
                f"{where}: {STATE_FILE} has {key} = {_short(state.get(key))}, not {kind.__name__} "
                f"(valid: the runner state rlplace writes, with step and identity)"
            )
    return state


def check_identity(folder: Path, family: str, identity: Mapping[str, Any]) -> None:
    """Refuse (ConfigError, one line) a checkpoint that another task family wrote, or whose `identity` in its
    STATE_FILE (the config values a resumed run must keep, by config key) differs from this run's `identity`."""
    saved_identity = read_state(folder, family)["identity"]
    for key, value in identity.items():
        saved = saved_identity.get(key)
        if saved != value:
            raise ConfigError(
                f"runner.resume = {str(folder)!r} is invalid: it was written with {key} = {saved!r}, this run has "
                f"{value!r} (a resumed run must keep it)"
            )


def _short(value: Any, limit: int = 80) -> str:
    """A value as JSON, cut to `limit` characters: what a damaged file holds, named in one line."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _complete(root: Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first."""
    steps = [(int(m.group(1)), p) for p in root.glob("step_*") if (m := _COMPLETE.match(p.name)) and p.is_dir()]
    return [path for _, path in sorted(steps)]


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, or None."""
    complete = _complete(root)
    return complete[-1] if complete else None


def prune(saved: Path, keep: int) -> list[Path]:
    """After checkpoint `saved` is complete, remove the other checkpoints of its folder but the newest `keep` - 1
    before it (`runner.keep_checkpoints`): also any after it, which a run resumed from an earlier checkpoint
    supersedes. Called once `saved` is complete, so a crash mid-removal leaves it whole. The removed folders."""
    step = step_of(saved)
    before = [path for path in _complete(saved.parent) if step_of(path) < step]
    after = [path for path in _complete(saved.parent) if step_of(path) > step]
    removed = before[: max(0, len(before) - (keep - 1))] + after
    for path in removed:
        shutil.rmtree(path)
    return removed


def step_of(path: Path) -> int:
    match = _COMPLETE.match(path.name)
    if match is None:
        raise ConfigError(f"runner.resume = {str(path)!r}: not a checkpoint folder (expected .../step_<k>)")
    return int(match.group(1))


def resolve_resume(resume: str | None, root: Path, verify_files: bool = True) -> Path | None:
    """The checkpoint `runner.resume` names under checkpoint folder `root` (checked against its manifest unless
    `verify_files` is off), or None to start fresh.

    `auto` is the newest checkpoint and an error when there is none (a run meant to continue must not silently
    start over); `auto_or_new` starts fresh then.
    """
    if resume is None:
        return None
    if resume in RESUME_AUTO:
        found = latest(root)
        if found is None and resume == "auto":
            raise ConfigError(
                f"runner.resume = 'auto': no checkpoint under {root} (runner.resume=auto_or_new starts fresh then)"
            )
        path = found
    else:
        path = Path(resume)
        if not path.is_dir():
            raise ConfigError(f"runner.resume = {resume!r}: no such checkpoint folder (valid: {RESUME_CHOICES})")
        step_of(path)
    if path is not None and verify_files:
        verify(path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
