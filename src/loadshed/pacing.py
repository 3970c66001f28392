"""Refusal pacing: a storm of immediate retries costs bounded CPU.

A refusal is cheap, but not free: the server parses the request, runs the middleware
and writes a 503 (0.07 to 0.16 ms of the server's CPU per 503 on CPython with uvicorn and httptools,
``bench/retry_storm.py``). Clients that retry at once after a 503 (hey, wrk,
bombardier, many SDK retry loops) turn each refusal into a new request at once, so
refusals can come at many thousands per second and take the CPU that the model's
event-loop dispatch and its worker need: the protection then costs capacity.

:class:`RefusalPacer` answers refusals without delay while they come slower than
``rate`` per second (with a burst of ``burst`` seconds' worth), and holds each one
beyond that until its turn at ``rate`` comes, a generic cell rate algorithm: a
closed-loop client that is refused waits for its 503 instead of spinning. A hold is
bounded by ``max_hold`` and by the expected wait the refusal's ``Retry-After`` is
computed from (a client is never held longer than it would have waited queued), and
at most ``max_held`` refusals are held at once (beyond that they are answered at
once). The default rate, 500 per second, keeps refusals to about 10 % of one core
at that cost.

Pure: the caller passes the time and does the waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadshed.checks import check_int, check_number

__all__ = ["DEFAULT_REFUSAL_PACING", "RefusalPacer", "RefusalPacing"]


@dataclass(frozen=True)
class RefusalPacing:
    """Settings of refusal pacing (validated on creation; see the module).

    Attributes:
        rate: refusals per second answered without delay (beyond the burst).
        burst: seconds' worth of ``rate`` answered at once after a quiet spell.
        max_hold: the longest a refusal is held, in seconds.
        max_held: refusals held at once at most; more are answered without delay.
    """

    rate: float = 500.0
    burst: float = 0.1
    max_hold: float = 1.0
    max_held: int = 10_000

    def __post_init__(self) -> None:
        check_number("refusal_pacing.rate", self.rate, minimum=0, min_open=True, unit="per second")
        check_number("refusal_pacing.burst", self.burst, minimum=0, unit="seconds")
        check_number("refusal_pacing.max_hold", self.max_hold, minimum=0, unit="seconds")
        check_int("refusal_pacing.max_held", self.max_held, minimum=0)

    @classmethod
    def at_rate(cls, rate: float, *, max_hold: float = 1.0) -> RefusalPacing | None:
        """Pacing at ``rate`` refusals per second, or None (off) for a rate of 0, as the
        command line's ``--refusal-rate`` reads."""
        if rate == 0:
            return None
        return cls(rate=rate, max_hold=max_hold)


DEFAULT_REFUSAL_PACING = RefusalPacing()
"""The middleware's default: 500 refusals per second unheld, holds of at most 1 s."""


class RefusalPacer:
    """Decides how long to hold each refusal (see the module). Not thread-safe: one
    per event loop."""

    __slots__ = ("_due", "_interval", "_tolerance", "held", "held_total", "hold_seconds_total",
                 "settings")  # fmt: skip

    def __init__(self, settings: RefusalPacing | None = None) -> None:
        self.settings = settings if settings is not None else RefusalPacing()
        self._interval = 1.0 / self.settings.rate
        self._tolerance = self.settings.burst
        self._due = 0.0  # when the next refusal would be answered at exactly ``rate``
        self.held = 0
        """Refusals being held now (the caller counts them in and out)."""
        self.held_total = 0
        """Refusals held so far."""
        self.hold_seconds_total = 0.0
        """Seconds of hold handed out so far."""

    def hold(self, now: float, expected_wait: float) -> float:
        """Seconds to hold a refusal made at ``now`` (0: answer it at once).

        ``expected_wait`` is the wait the refusal's ``Retry-After`` comes from; the hold
        never exceeds it nor ``max_hold``.
        """
        due = self._due if self._due > now else now
        delay = due - self._tolerance - now
        if delay <= 0.0:
            self._due = due + self._interval
            return 0.0
        settings = self.settings
        if self.held >= settings.max_held:
            return 0.0
        cap = settings.max_hold if settings.max_hold < expected_wait else expected_wait
        if delay > cap:
            # Past the bound the budget is exceeded: answer at the bound, and keep the
            # schedule from running away so later refusals are not held longer.
            delay = cap
            self._due = now + cap + self._tolerance
        else:
            self._due = due + self._interval
        if delay <= 0.0:
            return 0.0
        self.held_total += 1
        self.hold_seconds_total += delay
        return delay
