"""Gradient limit comparing short-term latency with a long-term average.

Reimplements the rule of Netflix concurrency-limits' ``Gradient2Limit``:

- ``long_rtt``: exponential average of rtt with factor ``2 / (long_window + 1)``, the
  first 10 samples plainly averaged;
- drift recovery: if ``long_rtt / rtt > 2``, ``long_rtt *= 0.95`` (latency has come back
  down after a long overload; do not wait for the average to forget it);
- app-limited: if ``inflight < L / 2``, keep ``L``;
- ``gradient = clamp(rtt_tolerance x long_rtt / rtt, 0.5, 1)``;
- ``L = clamp((1 - smoothing) L + smoothing (gradient L + queue_size), min, max)``.
"""

from __future__ import annotations

import math

from loadshed.checks import check_int, check_number, check_optional_number
from loadshed.limits.base import LimitAlgorithm, Sample, check_bounds

__all__ = ["Gradient2"]

_WARMUP_SAMPLES = 10


class Gradient2(LimitAlgorithm):
    """Gradient2-style limit: shrink when latency rises above its long-term average.

    Defaults (chosen for ML model endpoints: 1 to 64 workers, 10 ms to seconds per call):

    - ``initial_limit=4``, ``min_limit=1``, ``max_limit=128``: see
      :class:`~loadshed.limits.aimd.AIMD`. With ``gradient = 1`` the limit grows by
      ``smoothing x queue_size`` per sample, about x1.8 per service time when
      saturated, so 64 workers are reached in about 5 service times.
    - ``smoothing=0.2``, ``queue_size=4``, ``long_window=600``, ``rtt_tolerance=1.5``:
      Netflix's values (the rule is theirs; only the bounds differ).
    - ``drop_backoff=0.9`` (ours): a dropped sample multiplies the limit by 0.9 and
      does not feed ``long_rtt``. Netflix's Gradient2 ignores drops, so when every
      request ends at the same client timeout the rtt is perfectly stable, the
      gradient is 1 and the limit climbs to ``max_limit`` (Netflix issue #137).
      The limiter reports timed-out requests as dropped, so ours backs off instead.
      ``drop_backoff=None`` restores the published behaviour.

    Known limit: ``long_rtt`` follows whatever latency persists. Under sustained
    saturation, with ``rtt_tolerance`` 1.5 and a 600-sample average, the latency can
    grow by about 1/600 per sample without the gradient falling below 1, so the
    limit (and the queue) creeps up towards ``max_limit``. Prefer ``little`` or put
    a realistic ``max_limit`` on it.

    :meth:`published` returns Netflix's defaults (initial 20, min 20, max 200).
    """

    name = "gradient2"

    def __init__(
        self,
        *,
        initial_limit: int = 4,
        min_limit: int = 1,
        max_limit: int = 128,
        smoothing: float = 0.2,
        queue_size: float = 4.0,
        long_window: int = 600,
        rtt_tolerance: float = 1.5,
        drop_backoff: float | None = 0.9,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        smoothing = check_number("smoothing", smoothing, minimum=0, maximum=1, min_open=True)
        queue_size = check_number("queue_size", queue_size, minimum=0)
        long_window = check_int("long_window", long_window, minimum=1)
        rtt_tolerance = check_number("rtt_tolerance", rtt_tolerance, minimum=1)
        drop_backoff = check_optional_number(
            "drop_backoff", drop_backoff, minimum=0.5, maximum=1.0, max_open=True
        )
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.smoothing = smoothing
        self.queue_size = queue_size
        self.long_window = long_window
        self.rtt_tolerance = rtt_tolerance
        self.drop_backoff = drop_backoff
        self._estimate = float(initial_limit)
        self._long_rtt = 0.0
        self._long_count = 0
        self._long_sum = 0.0
        self._factor = 2.0 / (long_window + 1)

    @classmethod
    def published(cls) -> Gradient2:
        """Netflix concurrency-limits' ``Gradient2Limit`` defaults (drops ignored)."""
        return cls(
            initial_limit=20,
            min_limit=20,
            max_limit=200,
            smoothing=0.2,
            queue_size=4.0,
            long_window=600,
            rtt_tolerance=1.5,
            drop_backoff=None,
        )

    @property
    def limit(self) -> int:
        return self._clamp(self._estimate)

    @property
    def long_rtt(self) -> float:
        """The long-term average latency (0 before the first sample)."""
        return self._long_rtt

    def update(self, sample: Sample) -> int:
        if sample.dropped and self.drop_backoff is not None:
            self._estimate = self._bounded(self._estimate * self.drop_backoff)
            return self.limit
        rtt = sample.rtt
        if not (math.isfinite(rtt) and rtt > 0):
            return self.limit  # no latency information
        long_rtt = self._add_long(rtt)
        if long_rtt / rtt > 2.0:
            self._long_rtt = long_rtt * 0.95
        if sample.inflight < self._estimate / 2:
            return self.limit  # app-limited
        gradient = max(0.5, min(1.0, self.rtt_tolerance * long_rtt / rtt))
        target = self._estimate * gradient + self.queue_size
        target = self._estimate * (1.0 - self.smoothing) + target * self.smoothing
        self._estimate = self._bounded(target)
        return self.limit

    def _add_long(self, rtt: float) -> float:
        if self._long_count < _WARMUP_SAMPLES:
            self._long_count += 1
            self._long_sum += rtt
            self._long_rtt = self._long_sum / self._long_count
        else:
            self._long_rtt = self._long_rtt * (1.0 - self._factor) + rtt * self._factor
        return self._long_rtt

    def _bounded(self, value: float) -> float:
        return max(float(self.min_limit), min(float(self.max_limit), value))

    def describe(self) -> str:
        return f"gradient2(limit={self.limit}, long_rtt={self._long_rtt * 1e3:.1f}ms)"
