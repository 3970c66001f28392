"""A limit that never changes: the baseline every adaptive algorithm is compared with."""

from __future__ import annotations

from loadshed.checks import check_int
from loadshed.limits.base import LimitAlgorithm, Sample

__all__ = ["Fixed"]


class Fixed(LimitAlgorithm):
    """A constant concurrency limit.

    Use it when the capacity is known and stable, e.g. a model server with N
    single-threaded workers: ``Fixed(N)`` admits exactly N requests at a time and
    queues the rest in the limiter, where they can be shed. Samples are ignored.
    """

    name = "fixed"
    uses_samples = False

    def __init__(self, limit: int) -> None:
        limit = check_int("limit", limit, minimum=1)
        self._limit = limit
        self.min_limit = limit
        self.max_limit = limit

    @property
    def limit(self) -> int:
        return self._limit

    def update(self, sample: Sample) -> int:
        """Ignore the sample: a fixed limit does not adapt."""
        return self._limit

    def describe(self) -> str:
        return f"fixed({self._limit})"
