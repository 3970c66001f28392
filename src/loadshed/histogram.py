"""``LatencyHistogram``: the HDR histogram of durations that every part of loadshed keeps
(the load generator's results, the adaptive client's statistics, the model runner's
service times).

Durations are recorded in whole microseconds, from 1 us to one hour (longer ones count as
one hour), with 3 significant digits by default. Merging is exact: merged percentiles equal
those of one histogram fed every value, and the compressed base64 form
(:meth:`LatencyHistogram.encode`) is HdrHistogram's own, readable by other tools.
"""

from __future__ import annotations

import math

from hdrh.histogram import HdrHistogram

__all__ = ["HIGHEST_US", "LOWEST_US", "PERCENTILES", "LatencyHistogram"]

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p75", 75.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p999", 99.9),
)
"""The percentiles :meth:`LatencyHistogram.summary` reports, by name."""

LOWEST_US = 1
"""The shortest duration told apart, in microseconds."""
HIGHEST_US = 3_600_000_000
"""The longest duration recorded (one hour), in microseconds."""


class LatencyHistogram:
    """An HDR histogram of durations, recorded in whole microseconds (1 us .. 1 h).

    ``significant_figures`` (3 by default: 0.1 % resolution) sets the size: 2 keeps ~3,300
    counters instead of ~23,000, and reads faster. Recording is on hot paths, and hdrh's
    ``record_value`` is pure Python (~25 us), so values are first rounded down to their HDR
    bucket (exactly as hdrh does) and counted in a dict; the counts reach the histogram in
    bulk before any read.

    ``hist`` wraps an existing ``hdrh`` histogram of microseconds instead (to read it; one
    recorded into must start at 1 us).
    """

    __slots__ = ("_hist", "_pending", "_sub_bucket_bits")

    def __init__(self, hist: HdrHistogram | None = None, *, significant_figures: int = 3) -> None:
        if hist is None:
            hist = HdrHistogram(LOWEST_US, HIGHEST_US, significant_figures)
        self._hist = hist
        self._pending: dict[int, int] = {}
        # Values below 2 ** bits have a bucket of their own (2048 of them at 3 figures).
        self._sub_bucket_bits = int(hist.sub_bucket_count).bit_length() - 1

    def record(self, seconds: float) -> None:
        """Record one duration in seconds (clamped to the trackable range)."""
        micros = int(seconds * 1e6 + 0.5)
        if micros < LOWEST_US:
            micros = LOWEST_US
        elif micros > HIGHEST_US:
            micros = HIGHEST_US
        # The lowest value of its bucket: the top bits, as many as the sub-buckets need.
        shift = micros.bit_length() - self._sub_bucket_bits
        if shift > 0:
            micros = (micros >> shift) << shift
        pending = self._pending
        pending[micros] = pending.get(micros, 0) + 1

    def _flush(self) -> HdrHistogram:
        if self._pending:
            record = self._hist.record_value
            for value, count in self._pending.items():
                record(value, count)
            self._pending.clear()
        return self._hist

    def add(self, other: LatencyHistogram) -> None:
        """Add every value of ``other`` into this histogram."""
        self._flush().add(other._flush())

    def reset(self) -> None:
        """Forget every value."""
        self._pending.clear()
        self._hist.reset()

    @property
    def count(self) -> int:
        """Number of recorded values."""
        return int(self._flush().get_total_count())

    def percentile(self, percent: float) -> float:
        """The value at ``percent`` (0..100) in seconds; 0 when empty."""
        if self.count == 0:
            return 0.0
        return float(self._hist.get_value_at_percentile(percent)) / 1e6

    def percentiles(self, percents: list[float]) -> dict[float, float]:
        """The values at several percentiles at once, in seconds (``{}`` when empty).

        One pass that stops at the highest percentile asked for: about a tenth of
        :meth:`summary`'s cost, for readers that poll (a runner's ``stats()``).
        """
        if self.count == 0:
            return {}
        values = self._hist.get_percentile_to_value_dict(percents)
        return {percent: float(value) / 1e6 for percent, value in values.items()}

    def summary(self) -> dict[str, float | int]:
        """``{count, p50, p75, p90, p99, p999, max, mean, stdev}``, durations in seconds.

        One pass over the counts gives the same values as hdrh's per-statistic methods
        (percentiles: the highest equivalent value; mean and stdev: median equivalents),
        which each walk the whole array in Python and take ~0.1 s apiece.
        """
        total = self.count
        hist = self._hist
        out: dict[str, float | int] = {"count": total}
        if total == 0:
            out.update({name: 0.0 for name, _ in PERCENTILES})
            out.update(max=0.0, mean=0.0, stdev=0.0)
            return out
        targets = [
            (name, max(int(percent * total / 100 + 0.5), 1)) for name, percent in PERCENTILES
        ]
        found: dict[str, int] = {}
        buckets: list[tuple[int, int]] = []  # (median equivalent value, count)
        running = 0
        next_target = 0
        for index, count in enumerate(list(hist.counts)):
            if not count:
                continue
            value = hist.get_value_from_index(index)
            running += count
            while next_target < len(targets) and running >= targets[next_target][1]:
                found[targets[next_target][0]] = hist.get_highest_equivalent_value(value)
                next_target += 1
            low = hist.get_lowest_equivalent_value(value)
            high = hist.get_highest_equivalent_value(value)
            buckets.append((low + (high - low + 1) // 2, count))
        mean = sum(v * c for v, c in buckets) / total
        variance = sum((v - mean) ** 2 * c for v, c in buckets) / total
        for name, _ in PERCENTILES:
            out[name] = found.get(name, 0) / 1e6
        out["max"] = float(hist.get_max_value()) / 1e6
        out["mean"] = mean / 1e6
        out["stdev"] = math.sqrt(variance) / 1e6
        return out

    def encode(self) -> str:
        """The histogram in HdrHistogram's compressed base64 form (portable across tools)."""
        return bytes(self._flush().encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> LatencyHistogram:
        """Rebuild a histogram from :meth:`encode` output."""
        hist = cls()
        if text:
            hist._hist.decode_and_add(text.encode("ascii"))
        return hist
