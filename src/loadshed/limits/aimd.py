"""Additive increase, multiplicative decrease (the loss-based rule of TCP Reno).

Reimplements the rule of Netflix concurrency-limits' ``AIMDLimit``: on a drop (or an
rtt above ``timeout``) the limit is multiplied by ``backoff_ratio`` and rounded down;
otherwise, when the limit is in use (``2 * inflight >= limit``), it grows by one.
"""

from __future__ import annotations

import math

from loadshed.checks import check_number, check_optional_number
from loadshed.limits.base import LimitAlgorithm, Sample, check_bounds

__all__ = ["AIMD"]


class AIMD(LimitAlgorithm):
    """Loss-based limit: +1 per busy sample, ``x backoff_ratio`` per drop.

    Defaults (chosen for ML model endpoints: 1 to 64 workers, 10 ms to seconds per call):

    - ``initial_limit=4``: safe for a freshly deployed one-worker model; growth is +1
      per busy sample, i.e. the limit roughly doubles every service time while
      saturated, so a 64-worker server is reached in about 4 service times.
    - ``min_limit=1``: a model server that slows down to one call at a time must be
      able to get a limit of one (Netflix's 20 would keep a queue of 19 in front of it).
    - ``max_limit=128``: twice the largest usual worker count, room for batching
      servers, while a runaway limit stays bounded.
    - ``backoff_ratio=0.9``: Netflix's value; with ``floor`` a small limit still
      loses at least one slot per drop.
    - ``timeout=None``: model calls legitimately take seconds, so no latency cut-off
      by default. Overload is signalled by drops, and the limiter reports timed-out,
      503/429 and deadline-exceeded requests as dropped.

    :meth:`published` returns Netflix's defaults (initial 20, min 20, max 200,
    backoff 0.9, timeout 5 s).
    """

    name = "aimd"

    def __init__(
        self,
        *,
        initial_limit: int = 4,
        min_limit: int = 1,
        max_limit: int = 128,
        backoff_ratio: float = 0.9,
        timeout: float | None = None,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        backoff_ratio = check_number(
            "backoff_ratio", backoff_ratio, minimum=0.5, maximum=1.0, max_open=True
        )
        timeout = check_optional_number(
            "timeout", timeout, minimum=0, min_open=True, unit="seconds"
        )
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.backoff_ratio = backoff_ratio
        self.timeout = timeout
        self._limit = initial_limit

    @classmethod
    def published(cls) -> AIMD:
        """Netflix concurrency-limits' ``AIMDLimit`` defaults."""
        return cls(initial_limit=20, min_limit=20, max_limit=200, backoff_ratio=0.9, timeout=5.0)

    @property
    def limit(self) -> int:
        return self._limit

    def update(self, sample: Sample) -> int:
        timed_out = self.timeout is not None and sample.rtt > self.timeout
        if sample.dropped or timed_out:
            self._limit = self._clamp(math.floor(self._limit * self.backoff_ratio))
        elif 2 * sample.inflight >= self._limit:
            self._limit = self._clamp(self._limit + 1)
        # else: app-limited (less than half the limit in use): growing would be blind.
        return self._limit

    def describe(self) -> str:
        return f"aimd(limit={self._limit})"
