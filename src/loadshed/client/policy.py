"""The client's policy: which answers mean overload, how a call's outcome is named,
and the default limit algorithm."""

from __future__ import annotations

import enum

from loadshed.errors import REFUSAL_STATUSES
from loadshed.limits import AIMD, Windowed

__all__ = ["OVERLOAD_STATUSES", "CallOutcome", "default_client_limit"]

OVERLOAD_STATUSES = REFUSAL_STATUSES | {502, 504}
"""Answers that mean the upstream (or a gateway before it) is overloaded: dropped samples.
A refusal (:data:`~loadshed.errors.REFUSAL_STATUSES`) is safe to retry, and not an
*accept* for the adaptive throttle."""


class CallOutcome(str, enum.Enum):
    """A call's final outcome, the key it is counted under in ``ClientStats.counts``."""

    OK = "ok"
    """An answer below 400."""
    REFUSED = "refused"
    """A 429/503 not retried (retries spent, not allowed, or refused locally)."""
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    THROTTLED = "throttled"
    """Refused locally by the adaptive throttle before any attempt."""
    REJECTED = "rejected"
    """Refused by the local limiter (queue full, or the deadline cannot be met)."""
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    ERROR = "error"
    """Anything else raised."""
    CANCELLED = "cancelled"

    @property
    def answered(self) -> bool:
        """The call got an answer from the upstream (its times are recorded)."""
        return self in _ANSWERED

    @classmethod
    def of_status(cls, status: int) -> CallOutcome:
        """The outcome of a call whose last answer had ``status``."""
        if status < 400:
            return cls.OK
        if status in REFUSAL_STATUSES:
            return cls.REFUSED
        return cls.HTTP_4XX if status < 500 else cls.HTTP_5XX


_ANSWERED = frozenset(
    (CallOutcome.OK, CallOutcome.REFUSED, CallOutcome.HTTP_4XX, CallOutcome.HTTP_5XX)
)


def default_client_limit() -> Windowed:
    """The client's default limit: AIMD (initial 4, min 1, max 128) that halves on an
    overload sign, updated once per window of at least 8 calls (and 10 ms).

    Loss-based, because a client learns of overload from the upstream's answers
    (429/503, timeouts, connection errors). Two changes from per-call AIMD with
    Netflix's x0.9, each measured with ``bench/e3_remote_inference.py`` against an
    upstream that queues then refuses: per call, x0.9 is back at the queue's edge
    within a few calls and is refused about one call in ten, more than the 10 %
    retry budget absorbs; and a burst of refusals, one halving each, collapses the
    limit to 1 while calls are waiting. Halving once per window keeps the limit
    above the upstream's slots and is refused about one call in a hundred.
    """
    return Windowed(AIMD(backoff_ratio=0.5), window=0.01, min_samples=8, close_on_drop=True)
