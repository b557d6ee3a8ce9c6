"""Embodied test fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny tensors: one thread is as fast, and never contends with a busy machine (threads spinning for a core that
    another process holds can make a 10 ms update take seconds). Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
