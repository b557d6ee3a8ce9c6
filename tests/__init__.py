"""The test suite. What several of its modules share lives here."""

from pathlib import Path

TEST_PRESETS = f"hydra.searchpath=[file://{Path(__file__).resolve().parent / 'presets'}]"
"""The tests' own option files (tests/presets: `placement=one_device`, `placement=actor_apart`), joined to the
project's."""
