"""Results of a load run: exact counts and HDR latency histograms, mergeable across processes
and hosts, serialised to JSON with the histograms encoded."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from loadshed.errors import ConfigError
from loadshed.histogram import PERCENTILES, LatencyHistogram
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

JSON_VERSION = 1


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
