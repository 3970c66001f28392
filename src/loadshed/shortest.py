"""The ``shortest`` queue discipline's index: queued requests by predicted service time.

The admission core keeps its queue per priority class in arrival order; with
``discipline="shortest"`` it also files every queued request here. A request with a
cost goes into a heap by cost (with ``time = a + b x cost`` and ``b >= 0``, the order
of costs is the order of predicted times, whatever the fit) and into a sorted list of
the costs queued; one without a cost goes into a FIFO of its own (it is predicted at
the mean service time). Granting the shortest is then a comparison of two heads, and
the predicted work ahead of a new request a bisection and one sum, instead of scans of
the whole queue (1,000 queued: 15 us per grant and queued arrival, 690 us scanned;
``bench/queue_order_cost.py``).

Entries are dropped lazily: a request granted, refused or cancelled stays in its heap
or FIFO until it reaches the head (``live`` says which are still queued) or
:meth:`ShortestFirst.compact` rebuilds; its cost leaves the sorted list at once
(:meth:`ShortestFirst.removed`), since sums read that list whole. Pure bookkeeping:
no clock, no model; the admission core passes the predictions in.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Queued", "ShortestFirst"]


class Queued(Protocol):
    """What the index needs of a queued request."""

    @property
    def cost(self) -> float | None: ...

    @property
    def seq(self) -> int: ...


T = TypeVar("T", bound=Queued)


class ShortestFirst(Generic[T]):
    """Queued requests of ``classes`` priority classes, shortest predicted first."""

    __slots__ = ("_by_cost", "_costs", "_uncosted")

    def __init__(self, classes: int) -> None:
        self._by_cost: list[list[tuple[float, int, T]]] = [[] for _ in range(classes)]
        self._uncosted: list[deque[T]] = [deque() for _ in range(classes)]
        self._costs: list[list[float]] = [[] for _ in range(classes)]

    def add(self, level: int, item: T) -> None:
        """File a request just queued in class ``level``."""
        cost = item.cost
        if cost is None:
            self._uncosted[level].append(item)
        else:
            heapq.heappush(self._by_cost[level], (cost, item.seq, item))
            bisect.insort(self._costs[level], cost)

    def removed(self, level: int, item: T) -> None:
        """A request of class ``level`` left the queue (granted, refused, cancelled)."""
        cost = item.cost
        if cost is not None:
            costs = self._costs[level]
            index = bisect.bisect_left(costs, cost)
            if index < len(costs) and costs[index] == cost:
                del costs[index]

    def first(
        self,
        level: int,
        live: Callable[[T], bool],
        predict: Callable[[float], float],
        mean: float,
    ) -> T | None:
        """The live request of class ``level`` predicted shortest (the costed ones at
        ``predict(cost)``, the others at ``mean``; the oldest among equals), or None."""
        heap = self._by_cost[level]
        while heap and not live(heap[0][2]):
            heapq.heappop(heap)
        uncosted = self._uncosted[level]
        while uncosted and not live(uncosted[0]):
            uncosted.popleft()
        if not heap:
            return uncosted[0] if uncosted else None
        cost, seq, costed = heap[0]
        if not uncosted:
            return costed
        plain = uncosted[0]
        seconds = predict(cost)
        if seconds < mean or (seconds == mean and seq < plain.seq):
            return costed
        return plain

    def take(self, level: int, item: T) -> None:
        """Take out ``item``, which :meth:`first` has just returned for ``level``."""
        heap = self._by_cost[level]
        if heap and heap[0][2] is item:
            heapq.heappop(heap)
        else:
            self._uncosted[level].popleft()

    def costed_upto(self, level: int, cost: float) -> tuple[int, float]:
        """How many requests of class ``level`` with a cost of at most ``cost`` are
        queued, and the sum of their costs."""
        costs = self._costs[level]
        index = bisect.bisect_right(costs, cost)
        return index, sum(costs[:index])

    def compact(self, live: Callable[[T], bool]) -> None:
        """Drop every entry no longer queued (when dead ones outnumber the live)."""
        for level, heap in enumerate(self._by_cost):
            kept = [entry for entry in heap if live(entry[2])]
            heapq.heapify(kept)
            self._by_cost[level] = kept
        for level, uncosted in enumerate(self._uncosted):
            self._uncosted[level] = deque(item for item in uncosted if live(item))
