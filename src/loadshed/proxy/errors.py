"""Upstream faults as clear answers: what went wrong, which status, which JSON reason."""

from __future__ import annotations

import enum
import errno
import json

import aiohttp

__all__ = ["UpstreamFault", "classify", "error_body"]


class UpstreamFault(str, enum.Enum):
    """Why an exchange with an upstream failed (a label in metrics too)."""

    REFUSED = "refused"
    """The connection was refused (nothing listens, or its backlog is full)."""
    RESET = "reset"
    """The upstream closed or reset the connection before answering."""
    CONNECT_TIMEOUT = "connect_timeout"
    """No connection within the connect timeout."""
    TIMEOUT = "timeout"
    """No answer before the request's deadline or the upstream timeout."""
    PROTOCOL = "protocol"
    """The upstream's answer was not valid HTTP."""
    PROXY_RESOURCES = "proxy_resources"
    """The proxy itself could not open a connection: out of file descriptors
    (EMFILE, ENFILE) or socket buffers (ENOBUFS, ENOMEM). The proxy's fault, not the
    upstream's: 503, never counted toward marking the upstream down."""

    @property
    def status(self) -> int:
        """502 for broken connections and bad answers, 504 for timeouts, 503 when the
        proxy ran out of resources itself."""
        if self is UpstreamFault.PROXY_RESOURCES:
            return 503
        return 504 if self in (UpstreamFault.TIMEOUT, UpstreamFault.CONNECT_TIMEOUT) else 502

    @property
    def connection_failure(self) -> bool:
        """True when it says the upstream may be down (counts toward marking it down)."""
        return self in (UpstreamFault.REFUSED, UpstreamFault.RESET, UpstreamFault.CONNECT_TIMEOUT)

    def __str__(self) -> str:
        return self.value


_REASONS = {
    UpstreamFault.REFUSED: "upstream refused the connection",
    UpstreamFault.RESET: "upstream closed the connection before answering",
    UpstreamFault.CONNECT_TIMEOUT: "upstream did not accept a connection in time",
    UpstreamFault.TIMEOUT: "upstream did not answer before the deadline",
    UpstreamFault.PROTOCOL: "upstream sent an invalid HTTP response",
    UpstreamFault.PROXY_RESOURCES: "the proxy is out of file descriptors or socket buffers",
}
# errno values that say the proxy's own process or machine ran out, not the upstream.
_LOCAL_EXHAUSTION = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def _local_exhaustion(error: BaseException) -> bool:
    os_error = getattr(error, "os_error", None)  # ClientConnectorError keeps the cause
    for candidate in (error, os_error, error.__cause__):
        if isinstance(candidate, OSError) and candidate.errno in _LOCAL_EXHAUSTION:
            return True
    return False


def classify(error: BaseException) -> UpstreamFault:
    """Map an aiohttp/OS exception from an upstream exchange to a fault."""
    if _local_exhaustion(error):
        return UpstreamFault.PROXY_RESOURCES
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return UpstreamFault.CONNECT_TIMEOUT
    if isinstance(error, (TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamFault.TIMEOUT
    if isinstance(error, aiohttp.ClientConnectorError):
        if isinstance(error.os_error, TimeoutError):
            return UpstreamFault.CONNECT_TIMEOUT
        return UpstreamFault.REFUSED
    if isinstance(error, aiohttp.ClientResponseError):  # a malformed status line or header
        return UpstreamFault.PROTOCOL
    return UpstreamFault.RESET  # ServerDisconnectedError, ClientOSError, payload errors


def error_body(error: str, reason: str) -> bytes:
    """The proxy's JSON error body: ``{"error": ..., "reason": ...}``."""
    return json.dumps({"error": error, "reason": reason}).encode()


def fault_body(fault: UpstreamFault, detail: str = "") -> bytes:
    """The JSON body for an upstream fault."""
    error = {503: "proxy_overloaded", 504: "gateway_timeout"}.get(fault.status, "bad_gateway")
    reason = _REASONS[fault] + (f" ({detail})" if detail else "")
    return json.dumps({"error": error, "reason": reason, "fault": fault.value}).encode()
