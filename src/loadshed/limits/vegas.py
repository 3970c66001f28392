"""Delay-based limit after TCP Vegas: estimate the queue from the latency rise.

Reimplements the rule of Netflix concurrency-limits' ``VegasLimit``. With
``lg = max(1, floor(log10 L))``, ``alpha = 3 lg``, ``beta = 6 lg``, ``threshold = lg``
and ``rtt_noload`` the lowest rtt seen (re-probed every ``random(0.5..1) x 30 x L``
samples), the queue estimate is ``q = ceil(L x (1 - rtt_noload / rtt))`` and:

- drop: ``L - lg``;
- ``2 x inflight < L`` (app-limited): keep;
- ``q <= threshold``: ``L + beta``; ``q < alpha``: ``L + lg``; ``q > beta``: ``L - lg``;
  otherwise keep.
"""

from __future__ import annotations

import math
import random

from loadshed.checks import check_int, check_number
from loadshed.limits.base import LimitAlgorithm, Sample, check_bounds

__all__ = ["Vegas"]


def _log10_root(limit: float) -> int:
    """``max(1, floor(log10 L))``: Netflix's ``Log10RootFunction``."""
    return max(1, int(math.log10(max(1.0, limit))))


class Vegas(LimitAlgorithm):
    """Vegas-style limit: hold between ``alpha`` and ``beta`` requests of queue.

    Defaults (chosen for ML model endpoints: 1 to 64 workers, 10 ms to seconds per call):

    - ``initial_limit=4``: a small first limit keeps a one-worker model from queueing
      20 deep right after a deploy; growth is ``+beta`` (6) per sample while no
      queue is seen, so a 64-worker server is reached within a few service times.
    - ``min_limit=1``, ``max_limit=128``: see :class:`~loadshed.limits.aimd.AIMD`.
    - ``smoothing=1.0`` and ``probe_multiplier=30``: Netflix's values.
    - ``probe_window_min=True`` (ours): a re-probe sets ``rtt_noload`` to the minimum
      rtt of the whole probe period, not to the one sample that happens to arrive
      at probe time. Model latencies are noisy (p99 several times p50); adopting a
      single slow sample as the no-load latency makes the queue estimate ~0 and the
      limit jump by ``beta`` per sample (``published()`` keeps the single sample).
    - ``ignore_dropped_rtt=True`` (ours): a dropped request's rtt (a fast 503, or a
      timeout) never becomes ``rtt_noload``; a fast error would otherwise poison the
      baseline and hold the limit low until the next probe.

    Known limit: under sustained saturation every sample carries the queue Vegas
    itself holds (``alpha..beta`` requests), so each re-probe raises ``rtt_noload``
    a little and the limit ratchets up (slower with ``probe_window_min``). At model
    concurrency that queue (3 to 6 requests) is also up to several service times
    long; prefer ``little`` for model endpoints.

    ``seed`` seeds the probe jitter (``random.Random(seed)``) so runs are repeatable.
    :meth:`published` returns Netflix's defaults (initial 20, max 1000).
    """

    name = "vegas"

    def __init__(
        self,
        *,
        initial_limit: int = 4,
        min_limit: int = 1,
        max_limit: int = 128,
        smoothing: float = 1.0,
        probe_multiplier: int = 30,
        probe_window_min: bool = True,
        ignore_dropped_rtt: bool = True,
        seed: int | None = 0,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        smoothing = check_number("smoothing", smoothing, minimum=0, maximum=1, min_open=True)
        probe_multiplier = check_int("probe_multiplier", probe_multiplier, minimum=1)
        if seed is not None:
            seed = check_int("seed", seed)
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.smoothing = smoothing
        self.probe_multiplier = probe_multiplier
        self.probe_window_min = probe_window_min
        self.ignore_dropped_rtt = ignore_dropped_rtt
        self._random = random.Random(seed)
        self._estimate = float(initial_limit)
        self._rtt_noload = 0.0
        self._period_min = math.inf
        self._probe_count = 0
        self._probe_jitter = self._random.uniform(0.5, 1.0)

    @classmethod
    def published(cls, seed: int | None = 0) -> Vegas:
        """Netflix concurrency-limits' ``VegasLimit`` defaults."""
        return cls(
            initial_limit=20,
            min_limit=1,
            max_limit=1000,
            smoothing=1.0,
            probe_multiplier=30,
            probe_window_min=False,
            ignore_dropped_rtt=False,
            seed=seed,
        )

    @property
    def limit(self) -> int:
        return self._clamp(self._estimate)

    @property
    def rtt_noload(self) -> float:
        """The latency taken as the no-queue baseline (0 until the first sample)."""
        return self._rtt_noload

    def update(self, sample: Sample) -> int:
        rtt = sample.rtt
        if not (math.isfinite(rtt) and rtt > 0):
            # No latency information; a drop is still a sign of overload.
            if sample.dropped:
                self._set(self._estimate - _log10_root(self._estimate))
            return self.limit
        baseline_candidate = not (sample.dropped and self.ignore_dropped_rtt)
        if baseline_candidate:
            self._period_min = min(self._period_min, rtt)
        self._probe_count += 1
        if self._probe_jitter * self.probe_multiplier * self._estimate <= self._probe_count:
            self._probe_jitter = self._random.uniform(0.5, 1.0)
            self._probe_count = 0
            if self.probe_window_min and self._period_min < math.inf:
                self._rtt_noload = self._period_min
            elif baseline_candidate or self._rtt_noload == 0.0:
                self._rtt_noload = rtt
            self._period_min = math.inf
            return self.limit
        if baseline_candidate and (self._rtt_noload == 0.0 or rtt < self._rtt_noload):
            self._rtt_noload = rtt
            return self.limit
        if self._rtt_noload == 0.0:
            # Only dropped samples so far: no baseline, but the drop still counts.
            if sample.dropped:
                self._set(self._estimate - _log10_root(self._estimate))
            return self.limit
        return self._update_estimate(rtt, sample.inflight, sample.dropped)

    def _update_estimate(self, rtt: float, inflight: int, dropped: bool) -> int:
        estimate = self._estimate
        lg = _log10_root(estimate)
        if dropped:
            target = estimate - lg
        elif inflight * 2 < estimate:
            return self.limit  # app-limited: the latency says nothing about the limit
        else:
            queue = math.ceil(estimate * (1.0 - self._rtt_noload / rtt))
            alpha, beta, threshold = 3 * lg, 6 * lg, lg
            if queue <= threshold:
                target = estimate + beta
            elif queue < alpha:
                target = estimate + lg
            elif queue > beta:
                target = estimate - lg
            else:
                return self.limit
        self._set(target)
        return self.limit

    def _set(self, target: float) -> None:
        target = max(float(self.min_limit), min(float(self.max_limit), target))
        self._estimate = (1.0 - self.smoothing) * self._estimate + self.smoothing * target

    def describe(self) -> str:
        return f"vegas(limit={self.limit}, rtt_noload={self._rtt_noload * 1e3:.1f}ms)"
