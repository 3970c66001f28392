"""What a load run does: validated options shared by ``bench``, ``sweep`` and ``capacity``.

Invalid options fail here, at construction, with a :class:`ConfigError` naming the flag.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from typing import Literal
from urllib.parse import urlsplit

from loadshed.errors import REFUSAL_STATUSES, ConfigError
from loadshed.retry import parse_retry_after  # re-exported: its home is loadshed.retry

__all__ = [
    "ARRIVALS",
    "CLIENTS",
    "DEFAULT_MAX_LAG_S",
    "REJECTED_STATUSES",
    "RETRY_AFTER",
    "Arrival",
    "BenchOptions",
    "ClientKind",
    "check_retry_jitter",
    "default_client",
    "parse_retry_after",
    "validate_url",
]

Arrival = Literal["constant", "poisson"]
ARRIVALS: tuple[Arrival, ...] = ("constant", "poisson")
ClientKind = Literal["raw", "aiohttp"]
CLIENTS: tuple[ClientKind, ...] = ("raw", "aiohttp")


def default_client() -> ClientKind:
    """``raw`` (the lean httptools client) when httptools is installed, else ``aiohttp``."""
    try:
        import httptools  # noqa: F401
    except ImportError:  # pragma: no cover - httptools comes with uvicorn[standard]
        return "aiohttp"
    return "raw"


DEFAULT_MAX_LAG_S = 0.05
"""Default bound on the p99 of the open loop's lag behind its schedule. Past it the generator,
not the target, is shaping the load, so the run is refused (timer jitter is ~1 ms)."""

REJECTED_STATUSES = REFUSAL_STATUSES
"""Statuses counted as rejections (load shedding), whose latency is tracked separately."""

RETRY_AFTER: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "loadshed_retry_after", default=None
)
"""Set by the HTTP clients, in the sending task, to the ``Retry-After`` seconds of a
429/503 (None otherwise): how the closed loop learns it without widening the status
every client returns."""


def check_retry_jitter(retry_jitter: float, honor_retry_after: bool) -> None:
    """Raise :class:`ConfigError` (``--retry-jitter``) unless the jitter is in [0, 1] and,
    when non-zero, comes with ``--honor-retry-after``."""
    if not 0.0 <= retry_jitter <= 1.0:
        raise ConfigError("--retry-jitter", f"must be within [0, 1], got {retry_jitter}")
    if retry_jitter and not honor_retry_after:
        raise ConfigError("--retry-jitter", "needs --honor-retry-after")


def validate_url(url: str, field: str = "URL") -> str:
    """Return ``url`` if it is an absolute http(s) URL with a host, else raise ConfigError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(field, f"{url!r} is not an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ConfigError(field, f"{url!r} has a malformed port") from None
    return url


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """One load run against one URL.

    Exactly one of ``clients`` (closed loop) and ``rate`` (open loop) is set.
    ``duration_s`` is the measured window; ``warmup_s`` runs before it and is excluded.
    """

    url: str
    clients: int | None = None
    rate: float | None = None
    arrival: Arrival = "constant"
    duration_s: float = 10.0
    warmup_s: float = 0.0
    timeout_s: float = 2.0
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    send_deadline: bool = False
    max_inflight: int | None = None
    processes: int = 1
    seed: int | None = None
    max_lag_s: float = DEFAULT_MAX_LAG_S
    client: ClientKind = dataclasses.field(default_factory=default_client)
    honor_retry_after: bool = False
    """Closed loop: after a 429/503 with ``Retry-After`` (seconds, or an HTTP date), a client
    waits that long before its next request, as a well-behaved client does."""
    retry_jitter: float = 0.0
    """With ``honor_retry_after``: each wait is ``Retry-After`` times a factor drawn
    uniformly from [1 - retry_jitter, 1 + retry_jitter] (0: exactly as told), so that
    clients refused together do not all come back together."""

    def __post_init__(self) -> None:
        validate_url(self.url)
        if (self.clients is None) == (self.rate is None):
            raise ConfigError("--clients/--rate", "give exactly one: --clients C or --rate R")
        if self.clients is not None and self.clients < 1:
            raise ConfigError("--clients", f"must be >= 1, got {self.clients}")
        if self.rate is not None and (not math.isfinite(self.rate) or self.rate <= 0):
            raise ConfigError("--rate", f"must be > 0 requests/s, got {self.rate}")
        if self.arrival not in ARRIVALS:
            raise ConfigError("--arrival", f"must be one of {', '.join(ARRIVALS)}")
        if not self.duration_s > 0:
            raise ConfigError("--duration", f"must be > 0, got {self.duration_s}")
        if self.warmup_s < 0:
            raise ConfigError("--warmup", f"must be >= 0, got {self.warmup_s}")
        if not self.timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {self.timeout_s}")
        if not self.method.isalpha():
            raise ConfigError("--method", f"{self.method!r} is not an HTTP method")
        if self.max_inflight is not None:
            if self.max_inflight < 1:
                raise ConfigError("--max-inflight", f"must be >= 1, got {self.max_inflight}")
            if self.rate is None:
                raise ConfigError("--max-inflight", "applies to the open loop (--rate) only")
        if self.processes < 1:
            raise ConfigError("--processes", f"must be >= 1, got {self.processes}")
        if self.clients is not None and self.processes > self.clients:
            raise ConfigError(
                "--processes", f"{self.processes} processes need at least as many --clients"
            )
        if self.client not in CLIENTS:
            raise ConfigError("--client", f"must be one of {', '.join(CLIENTS)}")
        if self.client == "raw" and default_client() != "raw":
            raise ConfigError("--client", "raw needs httptools (pip install httptools)")
        if self.honor_retry_after and self.rate is not None:
            raise ConfigError(
                "--honor-retry-after",
                "applies to the closed loop (--clients) only: open-loop arrivals do not wait",
            )
        check_retry_jitter(self.retry_jitter, self.honor_retry_after)
        if not self.max_lag_s > 0:
            raise ConfigError("--max-lag", f"must be > 0, got {self.max_lag_s}")

    @property
    def mode(self) -> Literal["closed", "open"]:
        """``closed`` (fixed clients) or ``open`` (fixed arrival rate)."""
        return "closed" if self.clients is not None else "open"

    @property
    def request_headers(self) -> dict[str, str]:
        """Headers sent with every request (``X-Request-Timeout`` with ``--send-deadline``)."""
        headers = dict(self.headers)
        if self.send_deadline:
            headers["X-Request-Timeout"] = f"{self.timeout_s:g}"
        return headers

    def split(self, parts: int) -> list[BenchOptions]:
        """Divide the load into ``parts`` shares for worker processes.

        Clients are dealt out as evenly as possible; the rate and ``max_inflight`` are divided
        (each share gets a distinct seed, and constant schedules are phase-shifted by the caller).
        """
        shares: list[BenchOptions] = []
        for index in range(parts):
            seed = None if self.seed is None else self.seed + index
            if self.clients is not None:
                clients = self.clients // parts + (1 if index < self.clients % parts else 0)
                shares.append(dataclasses.replace(self, clients=clients, processes=1, seed=seed))
            else:
                assert self.rate is not None
                inflight = None
                if self.max_inflight is not None:
                    inflight = max(1, self.max_inflight // parts)
                shares.append(
                    dataclasses.replace(
                        self,
                        rate=self.rate / parts,
                        max_inflight=inflight,
                        processes=1,
                        seed=seed,
                    )
                )
        return shares
