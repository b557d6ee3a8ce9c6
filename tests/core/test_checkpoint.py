"""Checkpoint folders: atomic publication with a manifest, verification before a resume, and `runner.resume`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from rlplace.core import checkpoint
from rlplace.core.errors import ConfigError
from rlplace.core.strategies.training_state import load_training_state, save_training_state


def _write(root: Path, step: int, payload: bytes = b"weights") -> Path:
    tmp = checkpoint.staging_dir(root, step)
    (tmp / "actor.pt").write_bytes(payload)
    (tmp / "runner.json").write_text(json.dumps({"step": step}))
    return checkpoint.commit(tmp)


def test_commit_publishes_a_verified_folder_with_a_manifest(tmp_path: Path) -> None:
    folder = _write(tmp_path, 3)
    assert folder.name == "step_000003" and not (tmp_path / "step_000003.tmp").exists()
    manifest = json.loads((folder / checkpoint.MANIFEST).read_text())
    assert set(manifest) == {"actor.pt", "runner.json"} and manifest["actor.pt"]["bytes"] == len(b"weights")
    checkpoint.verify(folder)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "actor.pt").write_bytes(b"weigh"),
            r"actor.pt has 5 bytes, the manifest says 7 \(truncated\?\)",
        ),
        (lambda f: (f / "actor.pt").write_bytes(b"WEIGHTS"), "actor.pt does not match its checksum"),
        (lambda f: (f / "runner.json").unlink(), "runner.json is missing"),
        (lambda f: (f / checkpoint.MANIFEST).unlink(), "no manifest.json"),
        (lambda f: (f / checkpoint.MANIFEST).write_text("{"), "manifest.json is unreadable"),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path: Path, damage, message: str) -> None:
    folder = _write(tmp_path, 1)
    damage(folder)
    with pytest.raises(ConfigError, match=f"runner.resume = '{folder}': {message}"):
        checkpoint.resolve_resume(str(folder), tmp_path)


def test_resume_auto_takes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    _write(tmp_path, 1)
    newest = _write(tmp_path, 2)
    checkpoint.staging_dir(tmp_path, 3)  # a save that was cut short
    assert checkpoint.resolve_resume("auto", tmp_path) == newest
    assert checkpoint.resolve_resume("auto_or_new", tmp_path) == newest
    assert checkpoint.resolve_resume(None, tmp_path) is None


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path: Path) -> None:
    old = [_write(tmp_path, step) for step in (1, 2, 10)]
    cut_short = checkpoint.staging_dir(tmp_path, 12)  # a save in progress is not a checkpoint: left alone
    saved = _write(tmp_path, 11)
    assert checkpoint.prune(saved, 2) == old[:2]
    assert sorted(tmp_path.iterdir()) == [old[2], saved, cut_short]
    assert checkpoint.prune(saved, 5) == []
    # Resumed from step 10 and saved step 11 again: what the first run saved after it is superseded.
    later = _write(tmp_path, 20)
    assert checkpoint.prune(saved, 1) == [old[2], later]


def test_resume_auto_without_a_checkpoint_is_refused_unless_asked_to_start_fresh(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"runner.resume = .auto.: no checkpoint under .* \(runner.resume=auto_or_new starts fresh then\)",
    ):
        checkpoint.resolve_resume("auto", tmp_path)
    assert checkpoint.resolve_resume("auto_or_new", tmp_path) is None


def test_resume_of_a_path_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such checkpoint folder"):
        checkpoint.resolve_resume(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ConfigError, match=r"not a checkpoint folder \(expected .../step_<k>\)"):
        checkpoint.resolve_resume(str(tmp_path), tmp_path)


def test_a_single_rank_saves_and_loads_its_training_state_without_warnings(tmp_path: Path) -> None:
    """One process without a process group: DCP's "assuming a single process" warning would reach the driver's
    console at every checkpoint of every one-rank actor."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_training_state(tmp_path / "actor", {"policy": (model, optimizer)})
        copy = torch.nn.Linear(3, 2)
        copy_optimizer = torch.optim.AdamW(copy.parameters(), lr=0.1)
        load_training_state(tmp_path / "actor", {"policy": (copy, copy_optimizer)})
    assert torch.equal(copy.weight, model.weight)
    assert torch.equal(
        copy_optimizer.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"]
    )
