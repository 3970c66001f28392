"""The proxy's settings, validated at construction: every bad value raises
:class:`~loadshed.errors.ConfigError` naming the flag and what is allowed."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from loadshed.config import AdmissionConfig, Discipline, LimitUnit
from loadshed.errors import REFUSAL_STATUSES, ConfigError
from loadshed.limits import make_limit
from loadshed.limits.fixed import Fixed
from loadshed.pacing import DEFAULT_REFUSAL_PACING, RefusalPacing
from loadshed.waitbound import DEFAULT_WAIT_CEILING

__all__ = ["ProxyConfig", "UpstreamURL", "parse_listen", "parse_upstream"]

_SCHEMES = ("http", "https")
_HEADER_NAME = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class UpstreamURL:
    """A validated upstream base URL: scheme, host, port and an optional path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def origin(self) -> str:
        """``scheme://host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def host_header(self) -> str:
        """The Host header the upstream expects."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.origin + self.prefix


def parse_upstream(text: str, flag: str = "--upstream") -> UpstreamURL:
    """Parse ``http://host:port[/prefix]``; raise ConfigError naming ``flag`` otherwise."""
    allowed = "an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError as exc:
        raise ConfigError(
            flag, f"{text!r} is not a valid URL ({exc}); expected {allowed}"
        ) from None
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ConfigError(flag, f"{text!r} is not a URL; expected {allowed}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(flag, f"{text!r}: no query, fragment or credentials; expected {allowed}")
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return UpstreamURL(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """Parse ``host:port`` (``[::1]:9000`` for IPv6); port 0 picks a free one."""
    allowed = "HOST:PORT, e.g. 127.0.0.1:9000 or [::1]:9000 (port 0..65535)"
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(flag, f"got {text!r}; expected {allowed}")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ConfigError(flag, f"got {text!r}; expected {allowed}")
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(flag, f"got {text!r}; expected {allowed}") from None
    elif ":" in host:
        raise ConfigError(flag, f"got {text!r}: put IPv6 hosts in brackets; expected {allowed}")
    return host, int(port_text)


def _positive(value: float | None, flag: str, *, allow_none: bool = True) -> None:
    if value is None:
        if not allow_none:
            raise ConfigError(flag, "required: a duration > 0, e.g. 2.5s or 500ms")
        return
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(flag, f"must be a duration > 0, e.g. 2.5s or 500ms; got {value!r}")


@dataclass(frozen=True)
class ProxyConfig:
    """Everything ``loadshed proxy`` needs; see ``loadshed proxy --help`` for each field.

    Defaults and why:
    - ``limit="little"``: each upstream's capacity is learned, no number to guess.
    - ``deadline=None``: requests without ``X-Request-Timeout`` get the patience the
      limiter learns from clients that gave up; ``upstream_timeout`` still bounds
      the wait for the upstream's response headers (30 s).
    - ``fail_threshold=3`` consecutive connection failures mark an upstream down;
      it is probed with a TCP connect every ``probe_interval`` (1 s).
    - ``max_request_line`` 8 KiB and ``max_header_bytes`` 64 KiB: what nginx and
      most servers accept; larger get 414 / 431. ``max_headers`` 100: gunicorn's and
      Apache's bound on the header count; more get 431.
    - ``header_timeout`` 10 s to receive a complete request head (408 and the
      connection closed after it): a slowloris client cannot hold a connection longer.
    - ``max_connections=None``: open client connections bounded by what the
      descriptor limit leaves room for, ``(RLIMIT_NOFILE - 64) // 2`` (a proxied
      request holds two descriptors); at the bound the oldest idle connection is
      closed, or the new one refused with 503 when none is idle.
    - ``max_body_bytes`` 8 MiB: a queued request's body is buffered (to notice a
      disconnect while it waits), so this bounds memory per queued request.
    - ``hold_abandoned=True``: a request whose client left or whose deadline passed
      (504) keeps its slot in the limit until the upstream answers (bounded by
      ``upstream_timeout``): most servers keep working on abandoned requests, and
      freeing the slot early would overload them. ``False`` closes the upstream
      connection at once, for servers that stop work on disconnect.
    - ``wait_ceiling`` 1 s: without ``max_queue_wait`` the queue's wait bound starts at
      one service time and grows while clients are patient up to this response time
      (:mod:`loadshed.waitbound`).
    - ``refusal_rate`` 500/s, ``max_refusal_hold`` 1 s: refusals beyond this rate are
      held before their 503 (:mod:`loadshed.pacing`); 0 turns it off.
    - ``cost_header="x-request-cost"``: a request that carries its cost there (rows,
      tokens) is admitted by its own predicted service time (:mod:`loadshed.costmodel`);
      None reads no cost.
    - ``discipline="fifo"``: queued requests are granted oldest first; ``shortest``
      grants the one with the shortest predicted service time (from its cost) first,
      which meets more deadlines and serves a little fewer cost units
      (docs/cost.md), ``lifo`` and ``codel`` as in the library.
    - ``limit_unit="requests"``: the limit counts requests in flight; ``cost`` makes
      it count the cost units in flight (the ``cost_header`` values; one for a request
      without), for upstreams whose capacity is memory (a KV cache's tokens), with a
      ``fixed:N`` limit in those units.
    - ``grace`` 10 s: on SIGTERM, requests in flight get this long to finish (queued
      ones are answered 503 at once), then the proxy exits.
    """

    upstreams: tuple[UpstreamURL, ...]
    host: str = "127.0.0.1"
    port: int = 9000
    limit: str = "little"
    max_queue: int = 1000
    max_queue_wait: float | None = None
    discipline: str = "fifo"
    wait_ceiling: float = DEFAULT_WAIT_CEILING
    refusal_rate: float = DEFAULT_REFUSAL_PACING.rate
    max_refusal_hold: float = DEFAULT_REFUSAL_PACING.max_hold
    deadline: float | None = None
    cost_header: str | None = "x-request-cost"
    limit_unit: str = "requests"
    upstream_timeout: float = 30.0
    connect_timeout: float = 2.0
    read_timeout: float = 30.0
    fail_threshold: int = 3
    probe_interval: float = 1.0
    max_request_line: int = 8192
    max_header_bytes: int = 65536
    max_headers: int = 100
    header_timeout: float = 10.0
    max_connections: int | None = None
    max_body_bytes: int = 8 << 20
    reject_status: int = 503
    hold_abandoned: bool = True
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    grace: float = 10.0

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ConfigError("--upstream", "at least one upstream URL is required")
        keys = [str(u) for u in self.upstreams]
        if len(set(keys)) != len(keys):
            raise ConfigError("--upstream", f"listed twice: {sorted(keys)}")
        try:
            algorithm = make_limit(self.limit)
        except ConfigError as exc:  # name the flag, keep the allowed values
            raise ConfigError("--limit", str(exc).removeprefix("limit: ")) from None
        try:
            unit = LimitUnit.parse(self.limit_unit)
        except ConfigError as exc:
            raise ConfigError("--limit-unit", str(exc).removeprefix("limit_unit: ")) from None
        if unit is LimitUnit.COST:
            if not isinstance(algorithm, Fixed):
                raise ConfigError(
                    "--limit-unit",
                    f"cost needs --limit fixed:N (N in cost units), got {self.limit!r}",
                )
            if self.cost_header is None:
                raise ConfigError("--limit-unit", "cost needs --cost-header (got none)")
        if self.max_queue < 0:
            raise ConfigError("--max-queue", f"must be an integer >= 0, got {self.max_queue}")
        Discipline.parse(self.discipline, "--discipline")
        _positive(self.max_queue_wait, "--max-queue-wait")
        _positive(self.deadline, "--deadline")
        for flag, value in (
            ("--wait-ceiling", self.wait_ceiling),
            ("--refusal-rate", self.refusal_rate),
            ("--max-refusal-hold", self.max_refusal_hold),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(flag, f"must be a number >= 0, got {value!r}")
        _positive(self.upstream_timeout, "--upstream-timeout", allow_none=False)
        _positive(self.connect_timeout, "--connect-timeout", allow_none=False)
        _positive(self.read_timeout, "--read-timeout", allow_none=False)
        _positive(self.probe_interval, "--probe-interval", allow_none=False)
        _positive(self.header_timeout, "--header-timeout", allow_none=False)
        if self.fail_threshold < 1:
            raise ConfigError(
                "--fail-threshold", f"must be an integer >= 1, got {self.fail_threshold}"
            )
        for flag, value, low in (
            ("--max-request-line", self.max_request_line, 64),
            ("--max-header-bytes", self.max_header_bytes, 256),
            ("--max-headers", self.max_headers, 1),
            ("--max-connections", 1 if self.max_connections is None else self.max_connections, 1),
            ("--max-body-bytes", self.max_body_bytes, 0),
        ):
            if value < low:
                raise ConfigError(flag, f"must be an integer >= {low}, got {value}")
        if not (math.isfinite(self.grace) and self.grace >= 0):
            raise ConfigError("--grace", f"must be a duration >= 0, e.g. 10s; got {self.grace!r}")
        if self.cost_header is not None and not _HEADER_NAME.fullmatch(str(self.cost_header)):
            raise ConfigError(
                "--cost-header",
                "must be a header name (letters, digits, - and _) or none, "
                f"got {self.cost_header!r}",
            )
        if self.reject_status not in REFUSAL_STATUSES:
            raise ConfigError("--reject-status", f"got {self.reject_status}, allowed: 429|503")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError("--metrics-port", f"must be 0..65535, got {self.metrics_port}")

    @property
    def admission(self) -> AdmissionConfig:
        """The admission settings of each upstream's limiter."""
        return AdmissionConfig(
            max_queue=self.max_queue,
            max_queue_wait=self.max_queue_wait,
            discipline=Discipline.parse(self.discipline),
            adaptive_wait_ceiling=self.wait_ceiling,
            limit_unit=LimitUnit.parse(self.limit_unit),
        )

    @property
    def refusal_pacing(self) -> RefusalPacing | None:
        """The refusal pacing these settings ask for (None: off)."""
        return RefusalPacing.at_rate(self.refusal_rate, max_hold=self.max_refusal_hold)
