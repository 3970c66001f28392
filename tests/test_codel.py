"""CoDel's standing-queue detector on its own (its use by Admission is tested in
tests/test_admission.py)."""

from __future__ import annotations

import pytest

from loadshed.codel import CoDel


def test_a_standing_queue_turns_codel_on_and_a_drained_one_off() -> None:
    codel = CoDel(target=0.005, interval=0.1, now=0.0)
    # an interval whose grants all waited 20 ms or more: the queue stands
    codel.tick(0.1, queued=3, oldest_enqueued_at=lambda: 0.05)
    codel.granted(0.02)
    codel.granted(0.03)
    codel.tick(0.2, queued=3, oldest_enqueued_at=lambda: 0.15)
    assert codel.overloaded
    assert codel.interval_end == pytest.approx(0.3)
    # one grant at 1 ms in the next interval: the queue drained once, a burst
    codel.granted(0.001)
    codel.tick(0.31, queued=1, oldest_enqueued_at=lambda: 0.3)
    assert not codel.overloaded


def test_no_grant_in_an_interval_judges_the_oldest_wait() -> None:
    codel = CoDel(target=0.005, interval=0.1, now=0.0)
    codel.tick(0.1, queued=2, oldest_enqueued_at=lambda: 0.09)  # opens with queued work
    # nothing granted since: the oldest has waited 60 ms, the minimum is at least that
    codel.tick(0.2, queued=2, oldest_enqueued_at=lambda: 0.14)
    assert codel.overloaded
    # an empty queue in between resets the minimum to 0
    codel.emptied()
    codel.tick(0.31, queued=0, oldest_enqueued_at=lambda: None)
    assert not codel.overloaded


def test_the_interval_only_ends_on_time_and_the_short_wait_is_bounded() -> None:
    codel = CoDel(target=0.005, interval=0.1, now=0.0)
    codel.granted(1.0)  # ignored: the minimum starts at 0 before any queue
    codel.tick(0.05, queued=5, oldest_enqueued_at=lambda: 0.0)
    assert codel.interval_end == 0.1 and not codel.overloaded
    assert codel.short_wait(0.03) == 0.03
    assert codel.short_wait(2.0) == 0.1
