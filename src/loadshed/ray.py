"""loadshed's admission in every replica of a Ray Serve deployment (docs/ray.md).

    from fastapi import FastAPI
    from ray import serve
    from loadshed.ray import deployment_options, protect

    app = FastAPI()

    @serve.deployment(num_replicas=2, **deployment_options())
    @serve.ingress(protect(app))
    class Model:
        @app.post("/predict")
        async def predict(self, features: list[float]) -> dict[str, float]: ...

:func:`protect` adds :class:`ReplicaLoadShed` to the app's middleware. Ray pickles the
app when ``@serve.ingress`` runs, and Starlette builds middleware on the app's first
call, so every replica builds its own :class:`~loadshed.asgi.LoadShedMiddleware` and
its own :class:`~loadshed.limiter.Limiter` (``little`` by default). Replicas share no
state. Each replica's limit comes from its own traffic, the same as one loadshed process.

:func:`deployment_options` sets Ray's own bounds so that they do not get in the way.
``max_ongoing_requests`` is raised to everything loadshed may run or queue in a replica,
so Ray never holds back a request that loadshed would admit or queue. Ray's default of
5 would otherwise decide the concurrency. ``max_queued_requests`` (unbounded by
default) is bounded at loadshed's own queue bound. Ray's refusals carry loadshed's
status and a ``Retry-After``.

Metrics: each replica serves its loadshed metrics at ``metrics_path``, labelled with
``deployment``, ``replica`` and ``application``. Through Serve's proxy a scrape reaches
one replica that the router picks. To see every replica, the replica also copies its
gauges and counters into Ray's metrics (``ray.util.metrics``), which Ray exports on
each node's metrics port with the same labels.

Import this module only where Ray is installed (the ``ray`` extra). ``import loadshed``
never imports it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from ray import serve
from ray.serve.config import BackpressureConfig
from ray.serve.exceptions import RayServeException
from ray.util import metrics as ray_metrics
from starlette.applications import Starlette

from loadshed.asgi import LoadShedMiddleware, app_path
from loadshed.asgitypes import ASGIApp, Receive, Scope, Send
from loadshed.checks import check_optional_number
from loadshed.config import AdmissionConfig
from loadshed.errors import REFUSAL_STATUSES, ConfigError
from loadshed.limits import make_limit
from loadshed.limits.base import LimitAlgorithm
from loadshed.metrics import LoadshedMetrics

__all__ = [
    "RAY_REFUSAL_RETRY_AFTER",
    "ProtectionConfig",
    "ReplicaLoadShed",
    "deployment_options",
    "protect",
    "replica_labels",
]

_logger = logging.getLogger("loadshed.ray")

StarletteApp = TypeVar("StarletteApp", bound=Starlette)

RAY_REFUSAL_RETRY_AFTER = 1.0
"""``Retry-After`` in seconds on Ray's own refusals (its queue at a proxy is full). This
is loadshed's own floor: the middleware never sends less than 1 s."""


@dataclass(frozen=True)
class ProtectionConfig:
    """How every replica protects itself. Invalid values raise
    :class:`~loadshed.errors.ConfigError` naming the field when the object is built.

    The object is pickled to every replica, and each replica builds its own limiter
    from it.

    Attributes:
        limit: the limit algorithm's spec (``little`` by default, see
            :func:`loadshed.limits.make_limit`). It must be a name or an integer, not an
            instance, so that each replica builds a fresh algorithm.
        admission: the admission settings of each replica's limiter (queue bound,
            wait, discipline, ...), loadshed's defaults unless given.
        reject_status: 503 (default) or 429, for loadshed's refusals and for Ray's
            when its queue at a proxy is full.
        metrics_path: the path at which each replica serves its own metrics, labelled
            with the replica (None: not served). It is never limited.
        ray_metrics_interval: seconds between copies of the replica's gauges and
            counters into Ray's metrics (None: no copy). The default is 5 s.
    """

    limit: str | int = "little"
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    reject_status: int = 503
    metrics_path: str | None = "/metrics"
    ray_metrics_interval: float | None = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.limit, LimitAlgorithm):
            raise ConfigError(
                "limit",
                "give a name or an integer, not an algorithm instance: each replica "
                "builds its own algorithm from the spec",
            )
        make_limit(self.limit)  # ConfigError("limit", ...) naming the allowed values
        if not isinstance(self.admission, AdmissionConfig):
            raise ConfigError(
                "admission", f"expected an AdmissionConfig, got {type(self.admission).__name__}"
            )
        status = self.reject_status
        if (
            isinstance(status, bool)
            or not isinstance(status, int)
            or status not in REFUSAL_STATUSES
        ):
            raise ConfigError("reject_status", f"got {status!r}, allowed: 429|503")
        path = self.metrics_path
        if path is not None and (not isinstance(path, str) or not path.startswith("/")):
            raise ConfigError(
                "metrics_path", f"must be a path starting with / or None, got {path!r}"
            )
        object.__setattr__(
            self,
            "ray_metrics_interval",
            check_optional_number(
                "ray_metrics_interval",
                self.ray_metrics_interval,
                minimum=0,
                min_open=True,
                unit="seconds",
            ),
        )

    @property
    def most_per_replica(self) -> int:
        """The most requests loadshed may run or queue at once in one replica: the limit
        algorithm's ``max_limit`` plus the queue bound ``admission.max_queue``."""
        return make_limit(self.limit).max_limit + self.admission.max_queue


_DEFAULT = ProtectionConfig()


def _config(config: ProtectionConfig | None) -> ProtectionConfig:
    if config is None:
        return _DEFAULT
    if not isinstance(config, ProtectionConfig):
        raise ConfigError("config", f"expected a ProtectionConfig, got {type(config).__name__}")
    return config


def deployment_options(config: ProtectionConfig | None = None) -> dict[str, Any]:
    """Keyword arguments for ``@serve.deployment`` that let loadshed, not Ray, decide.

    - ``max_ongoing_requests``: :attr:`ProtectionConfig.most_per_replica`. A replica then
      takes every request that loadshed could admit or queue. Loadshed bounds what runs
      and what waits, refuses early with ``Retry-After`` and drops work whose client
      left. Ray's default of 5 would instead fix each replica's concurrency at 5. Past
      5, requests would wait in the proxy, where no deadline is checked.
    - ``max_queued_requests``: ``admission.max_queue``, the same bound loadshed puts on
      a replica's queue, here on each proxy's (and each handle's) queue. With replicas
      up, the proxy's queue holds requests only while it picks a replica. It fills when
      no replica can take them: none is running yet, or all are being replaced. Ray's
      default (-1) has no bound at all.
    - ``backpressure_config``: Ray's refusal of a full proxy queue answers
      ``reject_status`` with ``Retry-After: 1`` (:data:`RAY_REFUSAL_RETRY_AFTER`).
      Without it, Ray answers 503 with no ``Retry-After``.

    Merge your own options around it, e.g.
    ``@serve.deployment(num_replicas=2, **deployment_options())``. A key given after
    ``**deployment_options()`` in a dict literal overrides it.
    """
    config = _config(config)
    status: Literal[503, 429] = 429 if config.reject_status == 429 else 503
    return {
        "max_ongoing_requests": config.most_per_replica,
        # Ray takes -1 (no bound) or a positive bound; loadshed's max_queue may be 0.
        "max_queued_requests": max(1, config.admission.max_queue),
        "backpressure_config": BackpressureConfig(
            status_code=status, retry_after_s=RAY_REFUSAL_RETRY_AFTER
        ),
    }


def protect(app: StarletteApp, config: ProtectionConfig | None = None) -> StarletteApp:
    """Add :class:`ReplicaLoadShed` to a FastAPI or Starlette app and return the app.

    Call it before ``@serve.ingress(app)`` runs, or inside it as
    ``@serve.ingress(protect(app))``: Ray pickles the app at that point, and middleware
    added later never reaches the replicas. The middleware is built in each replica on
    the app's first call, so each replica has its own limiter. It is the outermost
    middleware added so far. Middleware added after it runs outside it, without
    admission control.

    For another ASGI app, give Serve a builder that Serve calls in each replica:
    ``@serve.ingress(lambda: ReplicaLoadShed(asgi_app, config))``.
    """
    if not isinstance(app, Starlette):
        raise TypeError(
            f"protect() takes a FastAPI or Starlette app, got {type(app).__name__}; for "
            "another ASGI app use serve.ingress(lambda: ReplicaLoadShed(app, config))"
        )
    app.add_middleware(ReplicaLoadShed, config=_config(config))
    return app


def replica_labels() -> dict[str, str]:
    """``deployment``, ``replica`` (the replica tag) and ``application`` of the replica
    this runs in, the tags Ray Serve puts on its own metrics. Empty outside a replica."""
    try:
        context = serve.get_replica_context()
    except RayServeException:
        return {}
    return {
        "deployment": context.deployment,
        "replica": context.replica_tag,
        "application": context.app_name,
    }


class ReplicaLoadShed:
    """One replica's admission control: a :class:`~loadshed.asgi.LoadShedMiddleware`
    with its own limiter and metrics, the metrics served at ``metrics_path`` with the
    replica's labels and copied into Ray's metrics.

    Build it in the replica (:func:`protect` arranges that). Built in the driver and
    pickled, it would carry one limiter's state to every replica.

    Attributes:
        middleware: the :class:`~loadshed.asgi.LoadShedMiddleware` that admits requests.
        metrics: its :class:`~loadshed.metrics.LoadshedMetrics` (without replica labels).
        labels: the replica's labels (:func:`replica_labels`).
        registry: the registry served at ``metrics_path``: ``metrics`` with ``labels``.
    """

    def __init__(self, app: ASGIApp, config: ProtectionConfig | None = None) -> None:
        config = _config(config)
        self.config = config
        self.labels = replica_labels()
        self.metrics = LoadshedMetrics()
        self.middleware = LoadShedMiddleware(
            app,
            config.limit,
            config=config.admission,
            reject_status=config.reject_status,
            metrics=self.metrics,
        )
        self.registry = CollectorRegistry()
        self.registry.register(_Labelled(self.metrics.registry, self.labels))
        self._metrics_path = config.metrics_path
        self._metrics_app = make_asgi_app(self.registry) if config.metrics_path else None
        # Ray's metrics carry the replica's tags only inside a replica; outside one
        # (tests, local runs) there is nothing to copy them to.
        self._exporter = (
            _RayExporter(self.metrics.registry, self.labels)
            if config.ray_metrics_interval is not None and self.labels
            else None
        )
        self._export_task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._export_task is None and self._exporter is not None:
            interval = self.config.ray_metrics_interval
            assert interval is not None
            self._export_task = asyncio.get_running_loop().create_task(self._exporter.run(interval))
        if (
            self._metrics_app is not None
            and scope["type"] == "http"
            and app_path(scope) == self._metrics_path
        ):
            await self._metrics_app(scope, receive, send)
            return
        await self.middleware(scope, receive, send)


class _Labelled(Collector):
    """Another registry's metrics with constant labels added to every sample."""

    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self._registry = registry
        self._labels = dict(labels)

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if not self._labels:
                yield family
                continue
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, **self._labels})
                for sample in family.samples
            ]
            yield labelled


class _RayExporter:
    """Copies a registry's gauges and counters into ``ray.util.metrics`` with the
    replica's tags. Histograms stay at ``metrics_path``: Ray's histograms take single
    observations, not the buckets of another histogram."""

    def __init__(self, registry: CollectorRegistry, labels: Mapping[str, str]) -> None:
        self._registry = registry
        self._labels = dict(labels)
        self._gauges: dict[str, ray_metrics.Gauge] = {}
        self._counters: dict[str, ray_metrics.Counter] = {}
        self._counted: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._failed = False

    async def run(self, interval: float) -> None:
        """Copy every ``interval`` seconds until cancelled (the replica's life)."""
        while True:
            try:
                self.export()
            except Exception as error:  # a metrics failure must never stop serving
                if not self._failed:
                    self._failed = True
                    _logger.warning("copying loadshed's metrics into Ray's failed: %r", error)
            await asyncio.sleep(interval)

    def export(self) -> None:
        """Copy the registry's current gauge values and counter increases once."""
        for family in self._registry.collect():
            if family.type == "gauge":
                for sample in family.samples:
                    if math.isfinite(sample.value):  # NaN: not known yet
                        gauge = self._gauge(family.name, family.documentation, sample.labels)
                        gauge.set(sample.value, tags={**sample.labels, **self._labels})
            elif family.type == "counter":
                for sample in family.samples:
                    if not sample.name.endswith("_total"):
                        continue  # _created: a timestamp, not a count
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    increase = sample.value - self._counted.get(key, 0.0)
                    if increase > 0:
                        counter = self._counter(family.name, family.documentation, sample.labels)
                        counter.inc(increase, tags={**sample.labels, **self._labels})
                        self._counted[key] = sample.value

    def _tag_keys(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        return (*self._labels, *sorted(labels))

    def _gauge(self, name: str, documentation: str, labels: Mapping[str, str]) -> ray_metrics.Gauge:
        gauge = self._gauges.get(name)
        if gauge is None:
            gauge = ray_metrics.Gauge(name, documentation, self._tag_keys(labels))
            self._gauges[name] = gauge
        return gauge

    def _counter(
        self, name: str, documentation: str, labels: Mapping[str, str]
    ) -> ray_metrics.Counter:
        counter = self._counters.get(name)
        if counter is None:
            counter = ray_metrics.Counter(name, documentation, self._tag_keys(labels))
            self._counters[name] = counter
        return counter
