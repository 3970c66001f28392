"""Time sources. Every component reads time from a :class:`Clock` so that the same
code runs in real time and in the simulator's virtual time without sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["MONOTONIC", "Clock", "MonotonicClock", "VirtualClock", "reader"]


@runtime_checkable
class Clock(Protocol):
    """A source of monotonic time in seconds."""

    def now(self) -> float:
        """Return the current time in seconds; only differences are meaningful."""
        ...


class MonotonicClock:
    """Real time: :func:`time.monotonic`."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


MONOTONIC = MonotonicClock()
"""The shared real-time clock."""


def reader(clock: Clock) -> Callable[[], float]:
    """A callable that reads ``clock``, for hot paths that read it on every request.

    For the real clock it is :func:`time.monotonic` itself, one Python call fewer
    per read than ``clock.now``.
    """
    return time.monotonic if type(clock) is MonotonicClock else clock.now


class VirtualClock:
    """Virtual time for the simulator and tests: it only moves when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError(f"seconds: must be >= 0, got {seconds}")
        self._now += seconds

    def set(self, when: float) -> None:
        """Jump to absolute time ``when`` (must not go backwards)."""
        if when < self._now:
            raise ValueError(f"when: time cannot go backwards ({when} < {self._now})")
        self._now = when
