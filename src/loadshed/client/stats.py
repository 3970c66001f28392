"""What the client reports: outcome counts and local-versus-upstream time percentiles."""

from __future__ import annotations

from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from loadshed.histogram import LatencyHistogram

__all__ = ["ClientStats", "Latency"]


@dataclass(frozen=True)
class Latency:
    """Percentiles of one kind of time, in seconds (HDR histogram, 3 significant digits)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, histogram: LatencyHistogram | HdrHistogram) -> Latency:
        """Summarise ``histogram`` (an ``hdrh`` one holds microseconds)."""
        if isinstance(histogram, HdrHistogram):
            histogram = LatencyHistogram(histogram)
        summary = histogram.summary()
        return cls(
            count=int(summary["count"]),
            mean=float(summary["mean"]),
            p50=float(summary["p50"]),
            p90=float(summary["p90"]),
            p99=float(summary["p99"]),
            p999=float(summary["p999"]),
            max=float(summary["max"]),
        )


@dataclass(frozen=True)
class ClientStats:
    """What :meth:`AdaptiveClient.stats` reports.

    ``counts`` holds, per call, its final outcome (``ok``, ``http_4xx``, ``http_5xx``,
    ``refused`` for a 429/503 that was not retried, ``throttled``, ``rejected`` by
    the local limiter, ``timeout``, ``connection_error``, ``error``, ``cancelled``)
    and, per attempt, ``attempts`` and ``retries`` (sent), ``retry_denied`` (by the
    budget), ``retry_throttled``, ``retry_no_time`` (the deadline was too close),
    ``upstream_429``, ``upstream_503``. ``queue_wait`` is time spent locally
    (limiter queue and backoff), ``upstream`` time at the upstream, ``total`` both;
    all three are recorded for calls that got an answer.
    """

    calls: int
    counts: dict[str, int]
    queue_wait: Latency
    upstream: Latency
    total: Latency
    limit: int
    inflight: int
    queue_length: int
    throttle_probability: float
    algorithm: str
    extra: dict[str, float] = field(default_factory=dict)
