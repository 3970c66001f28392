"""``Little``: loadshed's default limit for model endpoints.

The concurrency that keeps every worker busy with no queue is, by Little's law,
the delivery rate times the latency without queueing (the bandwidth-delay product,
as BBR computes it for TCP). ``Little`` measures both and sets

    limit = gain x max_delivery_rate x min_latency

Delivery rate is measured per request, as BBR does per packet: the successes
completed while a request was in flight, divided by its latency. Requests admitted
while the limiter had free slots are *app-limited*: their rate says nothing about
capacity and may only raise the estimate. The maximum rate and the minimum latency
are each filtered over the last ``filter_rounds`` rounds, where a round lasts one
minimum latency, so both forget an old regime together.

Phases, per round:
- start-up: gain 2 until the rate stops growing by 25 % for 3 saturated rounds, or
  the latency of a round rises well above the minimum (a queue formed);
- then a cycle of ``probe_gain`` for one round (look for more capacity), ``drain_gain``
  for one round (empty the queue the probe made, so the minimum latency is fresh),
  and gain 1 otherwise. Probing adds at least one slot and draining removes at least
  one, so the cycle works at the 1 to 64 workers of a model server.

A round with drops and no successes backs the limit off by ``backoff``; a round
with drops never probes. Rounds with no saturated sample keep the limit (traffic is
too low to say anything), so quiet periods neither shrink it nor cause probing.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from loadshed.errors import ConfigError
from loadshed.limits.base import LimitAlgorithm, Sample, check_bounds

__all__ = ["Little"]

_STARTUP_GAIN = 2.0
_STARTUP_GROWTH = 1.25
_STARTUP_STALL_ROUNDS = 3
_QUEUE_RISE = 1.5  # a round whose minimum latency exceeds this x min_latency has a queue


class Little(LimitAlgorithm):
    """Limit = gain x max delivery rate x min latency (see the module docstring).

    Defaults suit model endpoints (1 to 64 workers, 10 ms to seconds per call):
    ``initial_limit`` 8 (a few workers' worth; start-up doubles it per round while
    the rate grows), ``min_limit`` 1 (a single-worker model must be able to run one
    at a time), ``max_limit`` 1000, an 8-round gain cycle probing at 1.125 and
    draining at 0.875 (small enough that the probe's extra request waits a fraction
    of a service time), filters over 10 rounds, rounds of at least 10 ms.
    """

    name = "little"

    def __init__(
        self,
        *,
        initial_limit: int = 8,
        min_limit: int = 1,
        max_limit: int = 1000,
        probe_gain: float = 1.125,
        drain_gain: float = 0.875,
        cycle_rounds: int = 8,
        filter_rounds: int = 10,
        min_round: float = 0.01,
        backoff: float = 0.9,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        if probe_gain < 1:
            raise ConfigError("probe_gain", f"must be >= 1, got {probe_gain}")
        if not 0 < drain_gain <= 1:
            raise ConfigError("drain_gain", f"must be in (0, 1], got {drain_gain}")
        if cycle_rounds < 3:
            raise ConfigError("cycle_rounds", f"must be >= 3, got {cycle_rounds}")
        if filter_rounds < cycle_rounds:
            raise ConfigError(
                "filter_rounds", f"must be >= cycle_rounds ({cycle_rounds}), got {filter_rounds}"
            )
        if min_round <= 0:
            raise ConfigError("min_round", f"must be > 0 seconds, got {min_round}")
        if not 0 < backoff < 1:
            raise ConfigError("backoff", f"must be in (0, 1), got {backoff}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.probe_gain = probe_gain
        self.drain_gain = drain_gain
        self.cycle_rounds = cycle_rounds
        self.min_round = min_round
        self.backoff = backoff
        self._limit = initial_limit

        # Completion times (sorted; the first ``_history_start`` entries are
        # forgotten) to count how many completed during a request's lifetime.
        self._completions: list[float] = []
        self._history_start = 0
        # Per-round extremes, newest last: (max saturated rate or 0, min latency or inf).
        self._rounds: deque[tuple[float, float]] = deque(maxlen=filter_rounds)
        self._round_start: float | None = None
        self._round_rate = 0.0
        self._round_latency = math.inf
        self._round_successes = 0
        self._round_drops = 0
        self._round_saturated = False
        self._rate_max = 0.0  # last known maximum: kept when every round was app-limited
        self._latency_min = math.inf
        self._startup = True
        self._startup_best_rate = 0.0
        self._startup_stalls = 0
        self._phase = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def rate_max(self) -> float:
        """The filtered maximum delivery rate (requests per second)."""
        return self._rate_max

    @property
    def latency_min(self) -> float:
        """The filtered minimum latency (seconds); inf before the first success."""
        return self._latency_min

    @property
    def in_startup(self) -> bool:
        """True until start-up has found the capacity."""
        return self._startup

    def describe(self) -> str:
        phase = "startup" if self._startup else f"cycle[{self._phase}]"
        return (
            f"little(limit={self._limit}, rate_max={self._rate_max:.2f}/s, "
            f"latency_min={self._latency_min:.4f}s, {phase})"
        )

    def update(self, sample: Sample) -> int:
        now = sample.now
        if self._round_start is None:
            self._round_start = now
        if sample.dropped:
            self._round_drops += 1
        else:
            self._on_success(sample)
        round_length = max(self.min_round, self._latency_min if self._latency_min < math.inf else 0)
        if now - self._round_start >= round_length and (self._round_successes or self._round_drops):
            self._end_round(now)
        return self._limit

    def _on_success(self, sample: Sample) -> None:
        now, rtt = sample.now, max(sample.rtt, 0.0)
        self._round_successes += 1
        self._round_latency = min(self._round_latency, rtt)
        completions = self._completions
        if completions and now < completions[-1]:
            now = completions[-1]  # keep the history sorted if samples arrive out of order
        completions.append(now)
        self._forget_old_completions(now - max(4 * rtt, 1.0))
        if rtt <= 0:
            return
        # Completions during this request's lifetime, itself included.
        completed_during = len(completions) - bisect.bisect_right(
            completions, now - rtt, lo=self._history_start
        )
        rate = completed_during / rtt
        saturated = sample.inflight >= self._limit
        if saturated:
            self._round_saturated = True
        if saturated or rate > self._rate_max:
            self._round_rate = max(self._round_rate, rate)

    def _forget_old_completions(self, horizon: float) -> None:
        """Drop completion times before ``horizon``, compacting the list now and then."""
        completions = self._completions
        start = bisect.bisect_left(completions, horizon, lo=self._history_start)
        start = min(start, len(completions) - 1)
        if start > 1024 and start > len(completions) // 2:
            del completions[:start]
            start = 0
        self._history_start = start

    def _end_round(self, now: float) -> None:
        previous_latency_min = self._latency_min
        self._rounds.append((self._round_rate, self._round_latency))
        rates = [rate for rate, _ in self._rounds if rate > 0]
        if rates:
            self._rate_max = max(rates)
        self._latency_min = min(latency for _, latency in self._rounds)
        queue_formed = (
            self._round_latency < math.inf
            and previous_latency_min < math.inf
            and self._round_latency > _QUEUE_RISE * previous_latency_min
        )
        saturated = self._round_saturated
        successes, drops = self._round_successes, self._round_drops
        self._round_start = now
        self._round_rate = 0.0
        self._round_latency = math.inf
        self._round_successes = 0
        self._round_drops = 0
        self._round_saturated = False

        if drops and not successes:
            self._limit = self._clamp(math.floor(self._limit * self.backoff))
            return
        if not saturated or self._rate_max <= 0 or self._latency_min == math.inf:
            return  # app-limited: nothing learned about capacity
        bdp = self._rate_max * self._latency_min
        if self._startup:
            if queue_formed or drops:
                self._startup = False
            elif self._rate_max >= _STARTUP_GROWTH * self._startup_best_rate:
                self._startup_best_rate = self._rate_max
                self._startup_stalls = 0
            else:
                self._startup_stalls += 1
                if self._startup_stalls >= _STARTUP_STALL_ROUNDS:
                    self._startup = False
            if self._startup:
                self._limit = self._clamp(math.ceil(_STARTUP_GAIN * bdp))
                return
            self._phase = 1  # leave start-up through a drain round
        target = self._cycle_target(bdp, probe_allowed=not drops)
        self._phase = (self._phase + 1) % self.cycle_rounds
        self._limit = self._clamp(target)

    def _cycle_target(self, bdp: float, *, probe_allowed: bool) -> int:
        base = max(1, round(bdp))
        if self._phase == 0 and probe_allowed:
            return max(base + 1, math.floor(self.probe_gain * bdp))
        if self._phase == 1:
            return max(1, min(base - 1, math.ceil(self.drain_gain * bdp)))
        return base
