"""Shared fixtures: compose configs the way `rlplace-train` does, without starting anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rlplace.families import register

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "conf"


def group_options(group: str) -> list[str]:
    """Every option of a config group, by file name."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


@pytest.fixture
def compose_cfg() -> Callable[..., DictConfig]:
    register()

    def _compose(*overrides: str) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="train", overrides=list(overrides))

    return _compose
