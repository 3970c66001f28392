"""The event loop of the simulator: a heap of ``(time, seq, callback, argument)`` in
virtual time.

Events are plain tuples and callbacks take one argument, so that scheduling an event
allocates one tuple and nothing else (no closures, no event objects). ``seq`` breaks
ties between events at the same time in scheduling order, which makes every run with
the same seed replay identically.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from loadshed.clock import VirtualClock

__all__ = ["Engine"]

Callback = Callable[[Any], None]


class Engine:
    """Discrete-event scheduler driving a :class:`~loadshed.clock.VirtualClock`."""

    __slots__ = ("_heap", "_seq", "clock", "events")

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock if clock is not None else VirtualClock()
        self._heap: list[tuple[float, int, Callback, Any]] = []
        self._seq = itertools.count()
        self.events = 0
        """Events run so far (for performance reports)."""

    def now(self) -> float:
        """Current virtual time in seconds."""
        return self.clock.now()

    def at(self, when: float, callback: Callback, argument: Any = None) -> None:
        """Run ``callback(argument)`` at virtual time ``when`` (not before now)."""
        heapq.heappush(self._heap, (when, next(self._seq), callback, argument))

    def after(self, delay: float, callback: Callback, argument: Any = None) -> None:
        """Run ``callback(argument)`` ``delay`` seconds from now."""
        heapq.heappush(self._heap, (self.clock.now() + delay, next(self._seq), callback, argument))

    def run(self, until: float) -> None:
        """Run every event due at or before ``until``, then set the clock to ``until``."""
        heap = self._heap
        pop = heapq.heappop
        set_time = self.clock.set
        count = 0
        while heap and heap[0][0] <= until:
            when, _, callback, argument = pop(heap)
            set_time(when)
            callback(argument)
            count += 1
        self.events += count
        if until > self.clock.now():
            set_time(until)

    @property
    def pending(self) -> int:
        """Number of scheduled events not yet run."""
        return len(self._heap)
