"""Results of a load run: exact counts and HDR latency histograms, mergeable across processes
and hosts, serialised to JSON with the histograms encoded."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from hdrh.histogram import HdrHistogram

from loadshed.errors import ConfigError
from loadshed.loadgen.options import REJECTED_STATUSES

__all__ = [
    "ERROR_KINDS",
    "HISTOGRAMS",
    "PERCENTILES",
    "LatencyHistogram",
    "RunResult",
    "merge_results",
]

ERROR_KINDS = ("timeout", "connect", "reset", "other")
"""Failures without an HTTP status: client timeout, refused/unreachable, reset/closed early."""

HISTOGRAMS = ("all", "success", "rejected", "send_lag")
"""Histograms kept per run: every outcome, 2xx, 429/503, and the open loop's schedule lag."""

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p75", 75.0),
    ("p90", 90.0),
    ("p99", 99.0),
    ("p999", 99.9),
)

_LOWEST_US = 1
_HIGHEST_US = 3_600_000_000  # one hour
_SIGNIFICANT_FIGURES = 3
_SUB_BUCKET_BITS = 11  # 3 significant figures: 2 * 10**3 -> 2048 sub-buckets
JSON_VERSION = 1


class LatencyHistogram:
    """An HDR histogram of durations, recorded in whole microseconds (1 us .. 1 h, 3 digits).

    Merging is exact: merged percentiles equal those of one histogram fed every value.
    Recording is on the generator's hot path, and hdrh's ``record_value`` is pure Python
    (~25 us), so values are first rounded down to their HDR bucket (exactly as hdrh does) and
    counted in a dict; the counts reach the histogram in bulk before any read.
    """

    __slots__ = ("_hist", "_pending")

    def __init__(self, hist: HdrHistogram | None = None) -> None:
        self._hist = hist or HdrHistogram(_LOWEST_US, _HIGHEST_US, _SIGNIFICANT_FIGURES)
        self._pending: dict[int, int] = {}

    def record(self, seconds: float) -> None:
        """Record one duration in seconds (clamped to the trackable range)."""
        micros = int(seconds * 1e6 + 0.5)
        if micros < _LOWEST_US:
            micros = _LOWEST_US
        elif micros > _HIGHEST_US:
            micros = _HIGHEST_US
        # The lowest value of its bucket: 2048 sub-buckets (3 significant digits) per power of 2.
        shift = micros.bit_length() - _SUB_BUCKET_BITS
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

    @property
    def count(self) -> int:
        """Number of recorded values."""
        return int(self._flush().get_total_count())

    def percentile(self, percent: float) -> float:
        """The value at ``percent`` (0..100) in seconds; 0 when empty."""
        if self.count == 0:
            return 0.0
        return float(self._hist.get_value_at_percentile(percent)) / 1e6

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


@dataclasses.dataclass
class RunResult:
    """Everything one run (or a merge of runs) measured in its window.

    ``requests`` counts outcomes: 2xx, other HTTP statuses, and error kinds (timeout, connect,
    reset, other). Open-loop requests the ``--max-inflight`` bound kept from being sent are in
    ``not_sent``, not in ``requests``. Responses are bucketed by status code.

    Which requests belong to the window: in the closed loop, those completed in it; in the open
    loop, those *scheduled* in it, however late they end (so a stall cannot hide). Rates
    (throughput, goodput) always count responses *completed* in the window, so an overloaded
    target's throughput is what it served, not the rate it was offered.
    """

    mode: str
    url: str
    duration_s: float
    clients: int | None = None
    rate: float | None = None
    arrival: str | None = None
    warmup_s: float = 0.0
    timeout_s: float = 0.0
    processes: int = 1
    client: str = ""
    honor_retry_after: bool = False
    retry_jitter: float = 0.0
    status_counts: Counter[int] = dataclasses.field(default_factory=Counter)
    errors: Counter[str] = dataclasses.field(default_factory=Counter)
    not_sent: int = 0
    scheduled: int = 0
    histograms: dict[str, LatencyHistogram] = dataclasses.field(
        default_factory=lambda: {name: LatencyHistogram() for name in HISTOGRAMS}
    )
    completed_responses: int = 0
    completed_successes: int = 0
    generator_cpu_s: float = 0.0
    server: dict[str, float] = dataclasses.field(default_factory=dict)
    sources: int = 1

    # -- recording (hot path: keep it small) ------------------------------------------------

    def record_response(self, status: int, latency_s: float) -> None:
        """Count an HTTP response and its latency."""
        self.status_counts[status] += 1
        self.histograms["all"].record(latency_s)
        if 200 <= status < 300:
            self.histograms["success"].record(latency_s)
        elif status in REJECTED_STATUSES:
            self.histograms["rejected"].record(latency_s)

    def record_error(self, kind: str, latency_s: float) -> None:
        """Count a failure without a status (``timeout``, ``connect``, ``reset``, ``other``)."""
        self.errors[kind] += 1
        self.histograms["all"].record(latency_s)

    # -- derived figures --------------------------------------------------------------------

    @property
    def responses(self) -> int:
        """HTTP responses of any status."""
        return sum(self.status_counts.values())

    @property
    def successes(self) -> int:
        """2xx responses (all within the timeout: later ones are abandoned as timeouts)."""
        return sum(n for status, n in self.status_counts.items() if 200 <= status < 300)

    @property
    def rejections(self) -> int:
        """429 and 503 responses."""
        return sum(n for status, n in self.status_counts.items() if status in REJECTED_STATUSES)

    @property
    def requests(self) -> int:
        """Requests with an outcome: responses plus failures without a status."""
        return self.responses + sum(self.errors.values())

    def record_completion(self, status: int) -> None:
        """Count a response that arrived inside the window (for throughput and goodput)."""
        self.completed_responses += 1
        if 200 <= status < 300:
            self.completed_successes += 1

    @property
    def throughput_rps(self) -> float:
        """HTTP responses (any status) completed per second of the measured window."""
        return self.completed_responses / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def goodput_rps(self) -> float:
        """2xx responses (within the timeout) completed per second of the window."""
        return self.completed_successes / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def error_rate(self) -> float:
        """Share of requests that did not end in a 2xx (HTTP errors, rejections, failures)."""
        return 1.0 - self.successes / self.requests if self.requests else 0.0

    @property
    def requests_per_cpu_s(self) -> float:
        """Requests per CPU-second the generator itself spent: its efficiency."""
        return self.requests / self.generator_cpu_s if self.generator_cpu_s > 0 else math.nan

    def latency(self, histogram: str = "all") -> dict[str, float | int]:
        """Percentile summary of one histogram, in seconds."""
        return self.histograms[histogram].summary()

    # -- merging and JSON -------------------------------------------------------------------

    def add(self, other: RunResult) -> None:
        """Fold a run that ran alongside this one (another process or host) into it.

        Counts and histograms add exactly; the window is the longest of the two (the runs are
        concurrent), so rates add up too.
        """
        self.status_counts.update(other.status_counts)
        self.errors.update(other.errors)
        self.not_sent += other.not_sent
        self.scheduled += other.scheduled
        self.completed_responses += other.completed_responses
        self.completed_successes += other.completed_successes
        for name in HISTOGRAMS:
            self.histograms[name].add(other.histograms[name])
        self.generator_cpu_s += other.generator_cpu_s
        self.duration_s = max(self.duration_s, other.duration_s)
        if self.clients is not None or other.clients is not None:
            self.clients = (self.clients or 0) + (other.clients or 0)
        if self.rate is not None or other.rate is not None:
            self.rate = (self.rate or 0.0) + (other.rate or 0.0)
        if self.url != other.url:
            self.url = ", ".join(sorted(set(self.url.split(", ")) | set(other.url.split(", "))))
        self.processes += other.processes
        self.sources += other.sources
        for key, value in other.server.items():
            self.server[key] = max(self.server.get(key, 0.0), value)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict with every figure plus the encoded histograms."""
        return {
            "version": JSON_VERSION,
            "mode": self.mode,
            "url": self.url,
            "clients": self.clients,
            "rate": self.rate,
            "arrival": self.arrival,
            "processes": self.processes,
            "client": self.client,
            "honor_retry_after": self.honor_retry_after,
            "retry_jitter": self.retry_jitter,
            "sources": self.sources,
            "warmup_s": self.warmup_s,
            "timeout_s": self.timeout_s,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "scheduled": self.scheduled,
            "not_sent": self.not_sent,
            "responses": self.responses,
            "successes": self.successes,
            "completed_in_window": {
                "responses": self.completed_responses,
                "successes": self.completed_successes,
            },
            "rejections": self.rejections,
            "throughput_rps": self.throughput_rps,
            "goodput_rps": self.goodput_rps,
            "error_rate": self.error_rate,
            "status_counts": {str(k): v for k, v in sorted(self.status_counts.items())},
            "errors": {kind: self.errors.get(kind, 0) for kind in ERROR_KINDS},
            "latency_s": {name: self.latency(name) for name in ("all", "success", "rejected")},
            "send_lag_s": self.latency("send_lag"),
            "generator": {
                "cpu_s": self.generator_cpu_s,
                "requests_per_cpu_s": None
                if math.isnan(self.requests_per_cpu_s)
                else self.requests_per_cpu_s,
            },
            "server": dict(self.server),
            "histograms": {name: hist.encode() for name, hist in self.histograms.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "result") -> RunResult:
        """Rebuild a result from :meth:`to_json` output (counts and histograms are exact)."""
        try:
            if data.get("version") != JSON_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            result = cls(
                mode=str(data["mode"]),
                url=str(data["url"]),
                duration_s=float(data["duration_s"]),
                clients=data.get("clients"),
                rate=data.get("rate"),
                arrival=data.get("arrival"),
                warmup_s=float(data.get("warmup_s", 0.0)),
                timeout_s=float(data.get("timeout_s", 0.0)),
                processes=int(data.get("processes", 1)),
                client=str(data.get("client", "")),
                honor_retry_after=bool(data.get("honor_retry_after", False)),
                retry_jitter=float(data.get("retry_jitter", 0.0)),
                not_sent=int(data.get("not_sent", 0)),
                scheduled=int(data.get("scheduled", 0)),
                completed_responses=int(data["completed_in_window"]["responses"]),
                completed_successes=int(data["completed_in_window"]["successes"]),
                generator_cpu_s=float(data.get("generator", {}).get("cpu_s", 0.0)),
                server={str(k): float(v) for k, v in data.get("server", {}).items()},
                sources=int(data.get("sources", 1)),
            )
            result.status_counts.update({int(k): int(v) for k, v in data["status_counts"].items()})
            result.errors.update({str(k): int(v) for k, v in data["errors"].items() if v})
            encoded = data["histograms"]
            result.histograms = {
                name: LatencyHistogram.decode(str(encoded.get(name, ""))) for name in HISTOGRAMS
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(source, f"not a loadshed result JSON ({exc})") from None
        return result


def merge_results(results: Iterable[RunResult]) -> RunResult:
    """Merge concurrent runs (processes, hosts) into one result; raises on an empty input."""
    items = list(results)
    if not items:
        raise ConfigError("results", "nothing to merge")
    merged = RunResult.from_json(items[0].to_json())
    for item in items[1:]:
        merged.add(item)
    return merged
