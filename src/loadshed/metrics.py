"""Prometheus metrics for limiters, kept in the process that owns them.

    metrics = LoadshedMetrics()
    app = LoadShedMiddleware(app, metrics=metrics, metrics_path="/metrics")
    # or: metrics.track(limiter); mount metrics.asgi_app() where you like

Exported, labelled by limiter name:
- ``loadshed_limit``, ``loadshed_inflight``, ``loadshed_inflight_cost``,
  ``loadshed_queue_length`` (gauges, read at
  scrape time), ``loadshed_service_time_estimate_seconds``, ``loadshed_patience_seconds``;
- ``loadshed_limit_headroom``: slots of the limit over the algorithm's estimate, kept
  because they add throughput (``little``'s headroom, :mod:`loadshed.limits.headroom`);
- ``loadshed_requests_total{outcome,reason}``: outcome is success, dropped, ignored
  or rejected; reason is the rejection reason (empty otherwise); read from the
  limiter's own counters at scrape time (whole lifetime of the limiter), so counting
  costs a request nothing beyond the limiter's own dict increment;
- ``loadshed_queue_wait_seconds`` and ``loadshed_service_seconds`` histograms with
  buckets from 1 ms to 30 s;
- ``loadshed_queue_wait_bound_seconds``: the wait bound a request without a deadline
  gets now (:mod:`loadshed.waitbound`);
- ``loadshed_malformed_headers_total{header}``, ``loadshed_refusals_held_total`` and
  ``loadshed_refusal_hold_seconds_total`` (refusal pacing, :mod:`loadshed.pacing`) from
  tracked middleware.

Limiters that share a name (every limiter is ``default`` unless named) are exported
as one: limits, in-flight and queued requests and the counts add up, the estimates
are averaged.

With ``uvicorn --workers N`` every worker process has its own limiters and its own
metrics, and a scrape reaches one worker at random: run one worker per container
(or per port) and let Prometheus scrape each, which is also what makes per-worker
limits meaningful. Prometheus' multiprocess mode is not supported: it cannot carry
the scrape-time gauges.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loadshed.admission import REJECT_COUNT_KEYS, Admission
from loadshed.errors import Outcome, Priority, RejectReason

if TYPE_CHECKING:
    from loadshed.limiter import Limiter

__all__ = ["DEFAULT_BUCKETS", "LoadshedMetrics", "TrackedMiddleware"]

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
"""Latency buckets suited to model endpoints: 1 ms to 30 s."""


class _Listener:
    """Turns one limiter's events into histogram observations (label children bound once).

    Request counts are not events here: the limiter counts them anyway, and the
    collector reads its counters at scrape time, so a refusal (the most common request
    under overload) costs no metric update at all.
    """

    def __init__(self, metrics: LoadshedMetrics, name: str) -> None:
        self._queue_wait = metrics.queue_wait.labels(name)
        self._service = metrics.service.labels(name)

    def on_admit(self, queue_wait_s: float, priority: Priority) -> None:
        self._queue_wait.observe(queue_wait_s)

    def on_release(self, outcome: Outcome, service_s: float) -> None:
        if outcome is not Outcome.IGNORED:
            self._service.observe(service_s)

    def on_reject(self, reason: RejectReason, queue_wait_s: float) -> None:
        pass  # counted by the limiter, read at scrape time


class TrackedMiddleware(Protocol):
    """What the metrics read from a middleware, at scrape time: its public, read-only
    counters (:class:`~loadshed.asgi.LoadShedMiddleware` has them)."""

    @property
    def limiters(self) -> Sequence[Limiter]:
        """Every limiter the middleware uses."""

    @property
    def malformed_headers(self) -> Mapping[str, int]:
        """Malformed header values seen, by header name."""

    @property
    def refusals_held(self) -> int:
        """Refusals held by refusal pacing."""

    @property
    def refusal_hold_seconds(self) -> float:
        """Seconds of hold given to paced refusals."""


# loadshed_requests_total's (outcome, reason) labels -> the limiter's counter key.
_REQUEST_COUNTS: tuple[tuple[str, str, str], ...] = (
    *((outcome.value, "", outcome.value) for outcome in Outcome),
    *(("rejected", reason.value, REJECT_COUNT_KEYS[reason]) for reason in RejectReason),
)


class _StateCollector(Collector):
    """Reads limiter state at scrape time, so gauges are never stale."""

    def __init__(self) -> None:
        self.admissions: list[Admission] = []
        self.middlewares: list[TrackedMiddleware] = []

    def collect(self) -> Iterator[Metric]:
        # Limiters that share a name (every limiter is "default" unless named) are
        # exported as one, since one label set may carry one sample: slots, requests
        # and counts add up, the estimates are averaged over those that have one.
        by_name: dict[str, list[Admission]] = {}
        for admission in self.admissions:
            by_name.setdefault(admission.name, []).append(admission)
        gauges: list[tuple[str, str, Callable[[Admission], float | None], bool]] = [
            ("loadshed_limit", "Current concurrency limit.", lambda a: a.limit, True),
            (
                "loadshed_limit_headroom",
                "Slots of the limit over the algorithm's estimate kept because they add "
                "throughput (little: a job held ahead per worker).",
                lambda a: a.algorithm.headroom,
                True,
            ),
            (
                "loadshed_inflight",
                "Requests admitted and not yet released.",
                lambda a: a.inflight,
                True,
            ),
            (
                "loadshed_inflight_cost",
                "Cost units admitted and not yet released, when the limit counts cost "
                "(limit_unit=cost); 0 otherwise.",
                lambda a: a.inflight_cost,
                True,
            ),
            (
                "loadshed_queue_length",
                "Requests waiting for admission.",
                lambda a: a.queue_length,
                True,
            ),
            (
                "loadshed_service_time_estimate_seconds",
                "Moving average of service time used for wait estimates.",
                lambda a: a.service.mean,
                False,
            ),
            (
                "loadshed_patience_seconds",
                "Learned client patience (default deadline); NaN while unknown.",
                lambda a: a.patience.patience,
                False,
            ),
            (
                "loadshed_queue_wait_bound_seconds",
                "Longest wait a request without a deadline may queue for now.",
                lambda a: a.max_wait(),
                False,
            ),
            (
                "loadshed_cost_model_intercept_seconds",
                "Fitted service time of any request whatever its cost (a in a + b x cost); "
                "NaN until fitted.",
                lambda a: a.cost_model.intercept,
                False,
            ),
            (
                "loadshed_cost_model_slope_seconds",
                "Fitted service time per unit of cost (b in a + b x cost); NaN until fitted.",
                lambda a: a.cost_model.slope,
                False,
            ),
        ]
        requests = CounterMetricFamily(
            "loadshed_requests",
            "Requests by outcome (success, dropped, ignored, rejected) and rejection reason.",
            labels=["limiter", "outcome", "reason"],
        )
        for name, admissions in by_name.items():
            totals: dict[str, int] = {}
            for admission in admissions:
                for key, count in admission.counts.items():
                    totals[key] = totals.get(key, 0) + count
            for outcome, reason, key in _REQUEST_COUNTS:
                requests.add_metric([name, outcome, reason], totals.get(key, 0))
        yield requests
        costs = CounterMetricFamily(
            "loadshed_cost",
            "Request cost (rows, tokens) admitted, refused (or left the queue) and completed "
            "successfully, for requests that carry one.",
            labels=["limiter", "event"],
        )
        for name, admissions in by_name.items():
            for event in ("admitted", "refused", "completed"):
                costs.add_metric([name, event], sum(a.cost_counts[event] for a in admissions))
        yield costs
        for metric_name, documentation, read, additive in gauges:
            family = GaugeMetricFamily(metric_name, documentation, labels=["limiter"])
            for name, admissions in by_name.items():
                known = [v for v in map(read, admissions) if v is not None]
                if not known:
                    value = math.nan
                elif additive:
                    value = float(sum(known))
                else:
                    value = sum(known) / len(known)
                family.add_metric([name], value)
            yield family
        malformed = CounterMetricFamily(
            "loadshed_malformed_headers",
            "Requests whose deadline or priority header was malformed (ignored).",
            labels=["header"],
        )
        by_header: dict[str, int] = {}
        for middleware in self.middlewares:
            for header, count in middleware.malformed_headers.items():
                by_header[header] = by_header.get(header, 0) + count
        for header, count in sorted(by_header.items()):
            malformed.add_metric([header], count)
        yield malformed
        held = CounterMetricFamily(
            "loadshed_refusals_held",
            "Refusals held before their 503 because refusals came faster than the pacing rate.",
        )
        held.add_metric([], sum(m.refusals_held for m in self.middlewares))
        yield held
        hold_seconds = CounterMetricFamily(
            "loadshed_refusal_hold_seconds",
            "Seconds of hold given to paced refusals.",
        )
        hold_seconds.add_metric([], sum(m.refusal_hold_seconds for m in self.middlewares))
        yield hold_seconds


class LoadshedMetrics:
    """A Prometheus registry holding loadshed's metrics; see the module docstring."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.queue_wait = Histogram(
            "loadshed_queue_wait_seconds",
            "Time admitted requests waited in the queue.",
            ["limiter"],
            buckets=tuple(buckets),
            registry=self.registry,
        )
        self.service = Histogram(
            "loadshed_service_seconds",
            "Time from admission to release of requests that told the limit something.",
            ["limiter"],
            buckets=tuple(buckets),
            registry=self.registry,
        )
        self._state = _StateCollector()
        self.registry.register(self._state)
        self._tracked: set[int] = set()

    def track(self, limiter: Limiter | Admission) -> None:
        """Export this limiter's state and events (idempotent)."""
        admission = limiter if isinstance(limiter, Admission) else limiter.admission
        if id(admission) in self._tracked:
            return
        self._tracked.add(id(admission))
        admission.add_listener(_Listener(self, admission.name))
        self._state.admissions.append(admission)

    def track_all(self, limiters: Iterable[Limiter | Admission]) -> None:
        """Track several limiters."""
        for limiter in limiters:
            self.track(limiter)

    def track_middleware(self, middleware: TrackedMiddleware) -> None:
        """Track a middleware's limiters, its malformed-header counts and its refusal
        pacing (any object with :class:`TrackedMiddleware`'s read-only counters)."""
        self.track_all(middleware.limiters)
        if middleware not in self._state.middlewares:
            self._state.middlewares.append(middleware)

    def asgi_app(self) -> Callable[..., Any]:
        """An ASGI app serving this registry in the Prometheus text format."""
        return make_asgi_app(self.registry)
