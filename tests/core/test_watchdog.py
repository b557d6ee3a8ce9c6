"""The hang deadline follows the slowest step, never dropping below runner.hang_timeout_s."""

from __future__ import annotations

from types import SimpleNamespace

from rlplace.core.watchdog import STEP_FACTOR, HangDeadline


def test_the_deadline_grows_with_the_slowest_step_and_never_shrinks() -> None:
    groups = [SimpleNamespace(call_timeout_s=900.0), SimpleNamespace(call_timeout_s=900.0)]
    deadline = HangDeadline(groups, hang_timeout_s=60.0)
    assert deadline.observe(2.0) == 60.0  # short steps: the configured deadline holds
    assert deadline.observe(30.0) == 30.0 * STEP_FACTOR  # a long step extends it, so a slow run is not called hung
    assert deadline.observe(1.0) == 30.0 * STEP_FACTOR  # and a later quick step does not take it back
    assert [g.call_timeout_s for g in groups] == [30.0 * STEP_FACTOR] * 2
