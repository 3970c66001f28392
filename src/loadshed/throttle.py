"""Client-side adaptive throttling, as in Google's SRE book ("Handling Overload").

A client that keeps sending to an upstream that keeps refusing only adds load where
there is none to spare. Each client remembers, over a sliding window, how many
requests it attempted and how many the upstream *accepted* (answered with anything
but an overload refusal), and refuses locally with probability

    max(0, (requests - K * accepts) / (requests + 1))

With K = 2 nothing is refused locally until the upstream refuses more than half of
what it is sent; past that, the requests that still go out are about K times those
the upstream can take, enough to notice at once when it recovers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from loadshed.clock import MONOTONIC, Clock
from loadshed.errors import ConfigError

__all__ = ["AdaptiveThrottle", "SlidingCounts"]


class SlidingCounts:
    """Counters over a sliding time window, kept in ``buckets`` fixed-width buckets.

    ``add(field)`` counts an event now; ``totals()`` sums each field over the last
    ``window`` seconds (to within one bucket). Memory is O(buckets), whatever the rate.
    """

    def __init__(self, fields: int, *, window: float, buckets: int, clock: Clock) -> None:
        if not (window > 0 and math.isfinite(window)):
            raise ConfigError("window", f"must be a finite number of seconds > 0, got {window}")
        if buckets < 1:
            raise ConfigError("buckets", f"must be >= 1, got {buckets}")
        self.window = window
        self._width = window / buckets
        self._clock = clock
        self._epochs = [-1] * buckets  # which bucket-width interval each slot holds
        self._counts = [[0] * fields for _ in range(buckets)]

    def add(self, field: int, amount: int = 1) -> None:
        """Count ``amount`` events of ``field`` now."""
        self._slot()[field] += amount

    def totals(self) -> list[int]:
        """Each field's count over the window."""
        epoch = math.floor(self._clock.now() / self._width)
        oldest = epoch - len(self._epochs) + 1
        sums = [0] * len(self._counts[0])
        for slot_epoch, counts in zip(self._epochs, self._counts, strict=True):
            if slot_epoch >= oldest:
                for field, count in enumerate(counts):
                    sums[field] += count
        return sums

    def _slot(self) -> list[int]:
        epoch = math.floor(self._clock.now() / self._width)
        index = epoch % len(self._epochs)
        counts = self._counts[index]
        if self._epochs[index] != epoch:
            self._epochs[index] = epoch
            for field in range(len(counts)):
                counts[field] = 0
        return counts


_REQUESTS = 0
_ACCEPTS = 1


class AdaptiveThrottle:
    """Google SRE adaptive throttling: refuse locally while the upstream refuses.

    Call :meth:`allow` before each attempt and, for an attempt it allowed,
    :meth:`record` with whether the upstream accepted it. An attempt counts as a
    request when it ends (refused locally, or answered): counting it when it starts
    would make every call in flight look refused, and throttle a burst of calls
    made before the first answer. ``k`` is the SRE book's multiplier (2: tolerate
    up to half refused); ``window`` the history in seconds. ``random`` draws uniform
    numbers in [0, 1): inject a seeded one for tests. Nothing is refused while the
    window holds fewer than ``min_requests`` (as in the Kratos implementation), so a
    client that sends little is not throttled because of one or two refusals.
    """

    def __init__(
        self,
        *,
        k: float = 2.0,
        window: float = 60.0,
        buckets: int = 60,
        min_requests: int = 20,
        clock: Clock = MONOTONIC,
        random: Callable[[], float] = random.random,
    ) -> None:
        if not (k >= 1 and math.isfinite(k)):
            raise ConfigError("k", f"must be a finite number >= 1, got {k}")
        if min_requests < 0:
            raise ConfigError("min_requests", f"must be >= 0, got {min_requests}")
        self.k = k
        self.min_requests = min_requests
        self._random = random
        self._counts = SlidingCounts(2, window=window, buckets=buckets, clock=clock)
        self.refused = 0  # attempts refused locally, since creation

    @property
    def window(self) -> float:
        """History length in seconds."""
        return self._counts.window

    def reject_probability(self) -> float:
        """The current probability of refusing an attempt locally."""
        requests, accepts = self._counts.totals()
        if requests < self.min_requests:
            return 0.0
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def allow(self) -> bool:
        """False if the next attempt must be refused locally (not sent); a refusal is
        counted as a request at once."""
        probability = self.reject_probability()
        if probability > 0 and self._random() < probability:
            self._counts.add(_REQUESTS)
            self.refused += 1
            return False
        return True

    def record(self, accepted: bool) -> None:
        """An allowed attempt ended: ``accepted`` unless the upstream refused it as
        overloaded (or it failed to reach the upstream at all)."""
        self._counts.add(_REQUESTS)
        if accepted:
            self._counts.add(_ACCEPTS)

    def totals(self) -> tuple[int, int]:
        """(requests, accepts) over the window."""
        requests, accepts = self._counts.totals()
        return requests, accepts
