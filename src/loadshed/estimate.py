"""Estimators the limiter uses to predict waits: recent service times and the
patience clients have shown when they gave up.

Both are pure: values and times come in as arguments.
"""

from __future__ import annotations

import math
from collections import deque

from loadshed.errors import ConfigError

__all__ = ["PatienceEstimator", "ServiceTimeEstimator", "percentile"]

_REFRESH_EVERY = 64  # successes between two recomputations of the patience estimate


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
    """How long clients wait before giving up, learned from every request that ended.

    A request whose client gave up after ``w`` seconds says its patience was ``w``; one
    served after ``t`` seconds says its client would have waited more than ``t`` (a
    right-censored observation). The Kaplan-Meier estimate over the last ``window``
    give-ups and the last ``served_window`` successes gives the share of clients that
    leave by each time; ``patience`` is the time by which ``quantile`` (default 10 %)
    of them have left: the wait most clients tolerate, used as the default deadline of
    requests that carry none. With no successes recorded it is the plain low
    percentile of the give-ups.

    The successes are what keep a few early give-ups from locking the limiter in: the
    clients a load test cut off when it ended, or a caller that cancelled, are weighed
    against the many that were served after waiting longer (refused requests teach
    nothing: their clients got an answer). A give-up older than ``memory`` seconds is
    forgotten, so a patience learned once is relearned from fresh give-ups or dropped;
    and the admission core forgets the give-ups that no new request followed (the load
    left: a load test ended, connections were drained).

    ``patience`` stays None until ``min_samples`` give-ups are held, or while fewer
    than ``quantile`` of the clients are estimated to leave by the longest time
    observed. ``earliest`` is the same estimate from a single give-up on.
    """

    __slots__ = (
        "_dirty",
        "_earliest",
        "_give_ups",
        "_memory",
        "_min_samples",
        "_quantile",
        "_served",
        "_served_since",
    )

    def __init__(
        self,
        *,
        quantile: float = 0.1,
        window: int = 200,
        min_samples: int = 2,
        served_window: int = 512,
        memory: float = 60.0,
    ) -> None:
        if not 0 < quantile <= 1:
            raise ConfigError("patience_quantile", f"must be in (0, 1], got {quantile}")
        if min_samples < 1:
            raise ConfigError("patience_min_samples", f"must be >= 1, got {min_samples}")
        if window < 1:
            raise ConfigError("patience_window", f"must be >= 1, got {window}")
        if served_window < 0:
            raise ConfigError("patience_served_window", f"must be >= 0, got {served_window}")
        if not memory > 0:
            raise ConfigError("patience_memory", f"must be > 0 seconds, got {memory}")
        # (waited, when it was recorded; -inf: never forgotten), oldest first
        self._give_ups: deque[tuple[float, float]] = deque(maxlen=window)
        self._served: deque[float] = deque(maxlen=served_window)
        self._quantile = quantile
        self._min_samples = min_samples
        self._memory = memory
        self._earliest: float | None = None
        self._dirty = False  # recomputed when read after a change: reads are hot
        self._served_since = 0  # successes since the last recomputation

    def add(self, waited_seconds: float, now: float | None = None) -> None:
        """Record that a client gave up after ``waited_seconds`` (at time ``now``, for
        ``memory``; None: never forgotten)."""
        if waited_seconds > 0:
            self._give_ups.append((waited_seconds, -math.inf if now is None else now))
            self._dirty = True

    def served(self, waited_seconds: float, now: float) -> None:
        """Record that a client was served after ``waited_seconds`` (it would have waited
        longer); forget the give-ups older than ``memory`` at ``now``."""
        if waited_seconds > 0:
            self._served.append(waited_seconds)
            give_ups = self._give_ups
            if give_ups:
                self._served_since += 1
                if self._served_since >= _REFRESH_EVERY:
                    self._dirty = True
                horizon = now - self._memory
                while give_ups and give_ups[0][1] < horizon:
                    give_ups.popleft()
                    self._dirty = True

    def forget_after(self, start: float) -> None:
        """Forget the give-ups recorded after ``start``: the load that arrived by then
        left, and no more came (see ``Admission``: a quiet after give-ups)."""
        give_ups = self._give_ups
        while give_ups and give_ups[-1][1] > start:
            give_ups.pop()
            self._dirty = True

    def _refresh(self) -> None:
        self._dirty = False
        self._served_since = 0
        self._earliest = None
        if not self._give_ups:
            return
        # Give-ups (0) before successes (1) at the same time: those served were still
        # waiting. One event at a time: d give-ups among n at risk multiply the
        # survival by (n-1)/n ... (n-d)/(n-d+1) = 1 - d/n, as Kaplan-Meier groups them.
        events = sorted(
            [(waited, 0) for waited, _ in self._give_ups] + [(t, 1) for t in self._served]
        )
        at_risk = len(events)
        survival = 1.0
        threshold = 1.0 - self._quantile + 1e-9  # a product of fractions rounds
        for waited, was_served in events:
            if not was_served:
                survival *= 1.0 - 1.0 / at_risk
                if survival <= threshold:
                    self._earliest = waited
                    return
            at_risk -= 1

    @property
    def samples(self) -> int:
        """How many give-ups the window holds."""
        return len(self._give_ups)

    @property
    def earliest(self) -> float | None:
        """The patience estimate from one give-up on (the adaptive wait bound shrinks
        to it at once), or None."""
        if self._dirty:
            self._refresh()
        return self._earliest

    @property
    def patience(self) -> float | None:
        """The learned patience in seconds, or None while unknown (see the class)."""
        if self._dirty:
            self._refresh()
        if len(self._give_ups) < self._min_samples:
            return None
        return self._earliest
