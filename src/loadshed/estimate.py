"""Estimators the limiter uses to predict waits: recent service times and the
patience clients have shown when they gave up.

Both are pure: values and times come in as arguments.
"""

from __future__ import annotations

import math
from collections import deque

from loadshed.errors import ConfigError

__all__ = ["PatienceEstimator", "ServiceTimeEstimator", "percentile"]


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values, by nearest rank."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class _RecentValues:
    """The last ``size`` values with a cached sorted copy for percentiles.

    Sorted when read after a change, not on every add: adds come with every
    success, reads of the high percentile only with queued requests that carry a
    deadline (keeping the copy sorted on add measured ~2.4x the cost of an add).
    """

    __slots__ = ("_sorted", "_values")

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._sorted: list[float] | None = None

    def add(self, value: float) -> None:
        self._values.append(value)
        self._sorted = None

    def __len__(self) -> int:
        return len(self._values)

    def quantile(self, q: float) -> float:
        if self._sorted is None:
            self._sorted = sorted(self._values)
        return percentile(self._sorted, q)


class ServiceTimeEstimator:
    """Service time (admission to release) of recent successful requests.

    ``mean`` is an exponentially weighted moving average (for queue-drain estimates);
    ``high`` is a windowed high percentile (p90 of the last ``window`` samples), or
    the mean of the last ``recent`` samples when that is higher, so that a model that
    just got slower is believed within a few requests: it answers the conservative
    question "can this request still finish before its deadline?". Until the first
    sample both return ``initial`` (None: unknown).
    """

    def __init__(
        self,
        *,
        initial: float | None = None,
        alpha: float = 0.1,
        window: int = 100,
        high_quantile: float = 0.9,
        recent: int = 5,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ConfigError("alpha", f"must be in (0, 1], got {alpha}")
        if window < 1:
            raise ConfigError("window", f"must be >= 1, got {window}")
        if not 0 < high_quantile <= 1:
            raise ConfigError("high_quantile", f"must be in (0, 1], got {high_quantile}")
        if initial is not None and initial < 0:
            raise ConfigError("initial_service_time", f"must be >= 0 seconds, got {initial}")
        self._alpha = alpha
        self._mean = initial
        self._initial = initial
        self._recent = _RecentValues(window)
        self._high_quantile = high_quantile
        self._latest: deque[float] = deque(maxlen=max(1, recent))

    def add(self, service_seconds: float) -> None:
        """Record one request's service time in seconds (negative or NaN is ignored)."""
        if not service_seconds >= 0:
            return
        if self._mean is None or not self._latest:
            self._mean = service_seconds
        else:
            self._mean += self._alpha * (service_seconds - self._mean)
        self._recent.add(service_seconds)
        self._latest.append(service_seconds)

    @property
    def samples(self) -> int:
        """How many samples the window holds."""
        return len(self._recent)

    @property
    def mean(self) -> float | None:
        """Moving average of service time, or the initial guess, or None."""
        return self._mean

    @property
    def high(self) -> float | None:
        """High percentile of recent service times, or the initial guess, or None."""
        if not len(self._recent):
            return self._initial
        latest_mean = sum(self._latest) / len(self._latest)
        return max(self._recent.quantile(self._high_quantile), latest_mean)


class PatienceEstimator:
    """How long clients wait before giving up, learned from those that did.

    A low percentile (default p10) of recent give-up waits becomes the default
    deadline for requests that carry none: it is the wait most clients tolerate.
    It stays unknown (None) until ``min_samples`` give-ups were seen.
    """

    def __init__(self, *, quantile: float = 0.1, window: int = 200, min_samples: int = 2) -> None:
        if not 0 < quantile <= 1:
            raise ConfigError("patience_quantile", f"must be in (0, 1], got {quantile}")
        if min_samples < 1:
            raise ConfigError("patience_min_samples", f"must be >= 1, got {min_samples}")
        self._recent = _RecentValues(window)
        self._quantile = quantile
        self._min_samples = min_samples
        self._patience: float | None = None  # recomputed on each give-up: reads are hot

    def add(self, waited_seconds: float) -> None:
        """Record that a client gave up after ``waited_seconds``."""
        if waited_seconds > 0:
            self._recent.add(waited_seconds)
            if len(self._recent) >= self._min_samples:
                self._patience = self._recent.quantile(self._quantile)

    @property
    def samples(self) -> int:
        """How many give-ups the window holds."""
        return len(self._recent)

    @property
    def patience(self) -> float | None:
        """The learned patience in seconds, or None while too few give-ups were seen."""
        return self._patience
