"""What the simulator measures: per-phase counts and latencies as the clients saw
them, and each limiter's limit over time.

Goodput is successes within the client's timeout per second; throughput is every
response the clients received (successes and 503s) per second. Percentiles are exact
(nearest rank over every recorded latency): runs are short enough to keep them all.
"""

from __future__ import annotations

import bisect
import itertools
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from loadshed.sim.request import Status

__all__ = ["LimitTrace", "Phase", "PhaseStats", "Recorder", "percentile"]


def percentile(sorted_values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass
class Phase:
    """A named time span [start, end) whose results are reported together."""

    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Length of the phase."""
        return self.end - self.start


@dataclass
class PhaseStats:
    """Counters and latencies for one phase."""

    phase: Phase
    sent: int = 0
    success: int = 0
    rejected: int = 0
    origin_rejected: int = 0
    timed_out: int = 0
    success_cost: float = 0.0
    success_latency: array[float] = field(default_factory=lambda: array("d"))
    reject_latency: array[float] = field(default_factory=lambda: array("d"))

    def summary(self) -> dict[str, float | int | None]:
        """Rates, counts and percentiles of this phase (JSON-ready, rounded)."""
        seconds = self.phase.seconds
        ok = sorted(self.success_latency)
        bad = sorted(self.reject_latency)
        responses = self.success + self.rejected + self.origin_rejected
        return {
            "goodput_rps": _round(self.success / seconds),
            "goodput_cost_per_s": _round(self.success_cost / seconds),
            "throughput_rps": _round(responses / seconds),
            "p50_success_s": _round(percentile(ok, 0.50)),
            "p99_success_s": _round(percentile(ok, 0.99)),
            "p50_rejected_s": _round(percentile(bad, 0.50)),
            "p99_rejected_s": _round(percentile(bad, 0.99)),
            "sent": self.sent,
            "success": self.success,
            "rejected": self.rejected + self.origin_rejected,
            "origin_rejected": self.origin_rejected,
            "timed_out": self.timed_out,
        }


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


class Recorder:
    """Collects client-side outcomes into the phase their time falls in.

    Events outside every phase (warm-up, requests still running at the end) are not
    counted.
    """

    __slots__ = ("_last", "_starts", "_stats", "phases")

    def __init__(self, phases: Sequence[Phase]) -> None:
        ordered = sorted(phases, key=lambda p: p.start)
        for earlier, later in itertools.pairwise(ordered):
            if later.start < earlier.end:
                raise ValueError(f"phases {earlier.name} and {later.name} overlap")
        self.phases = list(ordered)
        self._starts = [p.start for p in self.phases]
        self._stats = [PhaseStats(p) for p in self.phases]
        if not self._stats:
            raise ValueError("at least one phase is needed")
        self._last = self._stats[0]

    def _stats_at(self, when: float) -> PhaseStats | None:
        last = self._last
        if last.phase.start <= when < last.phase.end:
            return last
        index = bisect.bisect_right(self._starts, when) - 1
        if index < 0:
            return None
        stats = self._stats[index]
        if when < stats.phase.end:
            self._last = stats
            return stats
        return None

    def sent(self, when: float) -> None:
        """A request was sent at ``when``."""
        stats = self._stats_at(when)
        if stats is not None:
            stats.sent += 1

    def response(self, status: int, latency: float, when: float, cost: float = 1.0) -> None:
        """The client got ``status`` after ``latency`` seconds, at ``when``; ``cost``
        is the request's (counted into cost goodput on a success)."""
        stats = self._stats_at(when)
        if stats is None:
            return
        if status == Status.SUCCESS:
            stats.success += 1
            stats.success_cost += cost
            stats.success_latency.append(latency)
        else:
            if status == Status.ORIGIN_REJECTED:
                stats.origin_rejected += 1
            else:
                stats.rejected += 1
            stats.reject_latency.append(latency)

    def timed_out(self, when: float) -> None:
        """A client gave up at ``when``."""
        stats = self._stats_at(when)
        if stats is not None:
            stats.timed_out += 1

    def stats(self, name: str) -> PhaseStats:
        """The stats of the phase called ``name``."""
        for stats in self._stats:
            if stats.phase.name == name:
                return stats
        raise KeyError(name)


class LimitTrace:
    """A limiter's limit over time: a step function recorded on every change."""

    __slots__ = ("times", "values")

    def __init__(self, start: float, value: int) -> None:
        self.times = array("d", [start])
        self.values = array("d", [float(value)])

    def record(self, when: float, value: int) -> None:
        """The limit became ``value`` at ``when`` (call only on a change)."""
        self.times.append(when)
        self.values.append(float(value))

    def value_at(self, when: float) -> float:
        """The limit in force at ``when``."""
        index = bisect.bisect_right(self.times, when) - 1
        return self.values[max(index, 0)]

    def mean(self, start: float, end: float) -> float:
        """Time-weighted mean of the limit over [start, end)."""
        if end <= start:
            return self.value_at(start)
        times, values = self.times, self.values
        index = max(bisect.bisect_right(times, start) - 1, 0)
        total = 0.0
        cursor = start
        while cursor < end:
            next_change = times[index + 1] if index + 1 < len(times) else end
            segment_end = min(next_change, end)
            total += values[index] * (segment_end - cursor)
            cursor = segment_end
            index += 1
        return total / (end - start)

    def converge_time(self, start: float, end: float) -> float | None:
        """Seconds from ``start`` until the limit stays within ±10 % (and at least ±1)
        of its final value up to ``end``; None if it is outside that band at the end.

        The final value is the time-weighted mean over the last quarter of the span,
        rounded, so that a limit that probes by one step around its level counts as
        settled at that level.
        """
        if end <= start:
            return None
        final = round(self.mean(start + 0.75 * (end - start), end))
        band = max(0.1 * final, 1.0)
        times, values = self.times, self.values
        first = max(bisect.bisect_right(times, start) - 1, 0)
        settled_at = start
        for index in range(first, len(times)):
            if times[index] >= end:
                break
            if abs(values[index] - final) > band:
                # outside the band until the next change
                settled_at = times[index + 1] if index + 1 < len(times) else end
        if settled_at >= end:
            return None
        return max(settled_at, start) - start
