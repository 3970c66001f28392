"""CoDel over the admission queue: adaptive LIFO with a short queue timeout.

Facebook's variant of Nichols and Jacobson's CoDel for request queues: the queue is
served FIFO while it drains; when the *minimum* wait of the requests granted over an
interval (``codel_interval``, 100 ms) exceeds a target (``codel_target``, 5 ms), the
queue is standing, not a burst, and it is served LIFO (the newest requests are the
ones whose clients still wait) with a short queue timeout until an interval's
minimum wait falls back under the target.

This module keeps that state and nothing else; :class:`~loadshed.admission.Admission`
tells it what was granted and asks it whether the queue is standing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["CoDel"]


class CoDel:
    """The standing-queue detector of one admission queue."""

    __slots__ = ("_min_wait", "interval", "interval_end", "overloaded", "target")

    def __init__(self, target: float, interval: float, now: float) -> None:
        self.target = target
        self.interval = interval
        self.interval_end = now + interval
        """When the current interval ends (a queued ticket may be evicted then)."""
        self.overloaded = False
        """The last interval's minimum wait exceeded the target: serve LIFO, time out soon."""
        self._min_wait = 0.0

    def granted(self, wait: float) -> None:
        """A queued request was granted after ``wait`` seconds."""
        if wait < self._min_wait:
            self._min_wait = wait

    def emptied(self) -> None:
        """The queue is empty: nothing waits, so the interval's minimum wait is 0."""
        self._min_wait = 0.0

    def short_wait(self, max_wait: float) -> float:
        """Queue timeout while the queue is standing: at most one interval. One
        expression serves the eviction and its scheduling, so a due expiry always
        evicts (no float gap)."""
        return min(self.interval, max_wait)

    def tick(self, now: float, queued: int, oldest_enqueued_at: Callable[[], float | None]) -> None:
        """End the interval if it is over: judge its minimum wait against the target.

        With requests queued and none granted in the interval, the oldest one's wait
        so far is the minimum (it has waited at least that long).
        """
        if now < self.interval_end:
            return
        if queued and self._min_wait == math.inf:
            oldest = oldest_enqueued_at()
            self._min_wait = now - oldest if oldest is not None else 0.0
        self.overloaded = self._min_wait > self.target
        self._min_wait = math.inf if queued else 0.0
        self.interval_end = now + self.interval
