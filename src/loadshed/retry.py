"""Retries that cannot become a retry storm: a retry budget, jittered exponential
backoff, and ``Retry-After`` parsing.

A client that retries every failure up to N times multiplies the load on an upstream
that is failing *because* it is overloaded. A budget caps retries at a fraction of
requests over a sliding window (10 % by default, as in Finagle and Envoy), so retries
can add at most that much load however bad things get.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from collections.abc import Callable

from loadshed.clock import MONOTONIC, Clock
from loadshed.errors import ConfigError
from loadshed.throttle import SlidingCounts

__all__ = ["Backoff", "RetryBudget", "parse_retry_after"]

_REQUESTS = 0
_RETRIES = 1


class RetryBudget:
    """Allows a retry only while retries stay within ``ratio`` of requests.

    Over the last ``window`` seconds, a retry is allowed if
    ``retries + 1 <= ratio * requests + min_retries``. ``min_retries`` lets a client
    that sends rarely still retry now and then. Call :meth:`record_request` for each
    first attempt and :meth:`try_retry` before each retry (it counts the retry if
    allowed).
    """

    def __init__(
        self,
        *,
        ratio: float = 0.1,
        window: float = 10.0,
        min_retries: int = 3,
        buckets: int = 10,
        clock: Clock = MONOTONIC,
    ) -> None:
        if not 0 <= ratio <= 1:
            raise ConfigError("ratio", f"must be within [0, 1], got {ratio}")
        if min_retries < 0:
            raise ConfigError("min_retries", f"must be >= 0, got {min_retries}")
        self.ratio = ratio
        self.min_retries = min_retries
        self._counts = SlidingCounts(2, window=window, buckets=buckets, clock=clock)
        self.denied = 0  # retries refused by the budget, since creation

    def record_request(self) -> None:
        """A first attempt was made."""
        self._counts.add(_REQUESTS)

    def try_retry(self) -> bool:
        """Spend one retry if the budget allows it; False (and counted) otherwise."""
        requests, retries = self._counts.totals()
        if retries + 1 <= self.ratio * requests + self.min_retries:
            self._counts.add(_RETRIES)
            return True
        self.denied += 1
        return False

    def totals(self) -> tuple[int, int]:
        """(requests, retries) over the window."""
        requests, retries = self._counts.totals()
        return requests, retries


class Backoff:
    """Delay before retry number ``attempt`` (1 for the first retry).

    Without a hint: "full jitter" exponential backoff, uniform in
    [0, min(cap, base * 2 ** (attempt - 1))), which spreads retries of many clients
    instead of synchronising them. With the upstream's ``Retry-After``: never sooner
    than asked, spread over up to ``retry_after_spread`` (10 %) more.
    """

    def __init__(
        self,
        *,
        base: float = 0.05,
        cap: float = 2.0,
        retry_after_spread: float = 0.1,
        random: Callable[[], float] = random.random,
    ) -> None:
        if not (base > 0 and math.isfinite(base)):
            raise ConfigError("backoff_base", f"must be a finite number of seconds > 0, got {base}")
        if not (cap >= base and math.isfinite(cap)):
            raise ConfigError("backoff_cap", f"must be finite and >= backoff_base, got {cap}")
        if not 0 <= retry_after_spread <= 1:
            raise ConfigError(
                "retry_after_spread", f"must be within [0, 1], got {retry_after_spread}"
            )
        self.base = base
        self.cap = cap
        self.retry_after_spread = retry_after_spread
        self._random = random

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry ``attempt`` (>= 1)."""
        if retry_after is not None:
            return retry_after * (1 + self.retry_after_spread * self._random())
        ceiling = min(self.cap, self.base * 2.0 ** min(attempt - 1, 30))
        return ceiling * self._random()


def parse_retry_after(value: str | bytes | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delay-seconds or an HTTP-date.

    The value is the header as text or as raw bytes (latin-1, as HTTP sends it).
    Fractional seconds are accepted. ``now`` is the wall-clock time (Unix seconds)
    used for dates, by default :func:`time.time`. Returns None when the value is
    missing or malformed (a bad hint is ignored, not fatal), and never a negative
    delay (a date in the past, or a negative number, is 0: retry now).
    """
    if value is None:
        return None
    text = (value.decode("latin-1") if isinstance(value, bytes) else value).strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP-date is always GMT
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
