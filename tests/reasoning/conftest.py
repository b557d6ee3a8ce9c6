"""The tiny LM folder the reasoning tests train: built here, never downloaded (not pretrained: these tests are about
behaviour, not accuracy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlplace.reasoning.models.tiny_lm import TinyLMShape, build_tiny_lm


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"), TinyLMShape(num_layers=1, hidden_size=64))
