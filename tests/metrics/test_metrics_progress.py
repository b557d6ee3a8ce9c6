"""The progress bar degrades to a plain line every k steps when stdout is not a terminal."""

from __future__ import annotations

import io

from rlplace.metrics import TrainingProgress


def test_progress_prints_plain_lines_without_a_tty() -> None:
    stream = io.StringIO()
    with TrainingProgress(25, every=10, stream=stream) as progress:
        assert not progress.interactive
        for step in range(1, 26):
            progress.update(step, {"env/episode_return": 1.5, "throughput/env_steps_per_s": 2048.0, "x": 1.0})
    lines = stream.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "train step 10/25",
        "train step 20/25",
        "train step 25/25",
    ]
    assert "return 1.5 | env steps/s 2048" in lines[0]
    assert "\x1b" not in stream.getvalue()


def test_progress_renders_a_rich_bar_on_a_terminal() -> None:
    stream = io.StringIO()
    with TrainingProgress(3, stream=stream, force_terminal=True) as progress:
        assert progress.interactive
        for step in range(1, 4):
            progress.update(step, {"env/episode_return": 2.0})
    assert "3/3" in stream.getvalue()
