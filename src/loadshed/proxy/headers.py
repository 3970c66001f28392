"""Header rewriting between client, proxy and upstream.

Hop-by-hop headers (RFC 9110 section 7.6.1: ``Connection`` and every header it
names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``, ``Transfer-Encoding``,
``Upgrade``) describe one connection and are never forwarded either way. Every
``Proxy-*`` header is stripped, not only the three RFC 9110 names (a client's
``Proxy-*`` is for this proxy, an upstream's for its own side), and so is a bare
``Proxy`` (httpoxy: CGI-style servers turn it into ``HTTP_PROXY``). ``Host``
is the upstream's; the client's goes on in ``X-Forwarded-Host``. The client's
address is appended to ``X-Forwarded-For`` and ``Forwarded``. The client's own
deadline header is replaced by the time it has left (``X-Request-Timeout``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["HOP_BY_HOP", "is_proxy_header", "request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Header names (lower case) that belong to one connection and are never forwarded
(besides every ``Proxy-*`` name: :func:`is_proxy_header`)."""


def is_proxy_header(lower: bytes) -> bool:
    """True for ``proxy`` and ``proxy-*`` (a lower-case name): never forwarded."""
    return lower[:5] == b"proxy" and (len(lower) == 5 or lower[5:6] == b"-")


# Set by the proxy: the upstream's Host, the remaining deadline, X-Forwarded-Host/Proto.
_REPLACED = frozenset(
    {
        b"host",
        b"x-request-timeout",
        b"grpc-timeout",
        b"x-forwarded-host",
        b"x-forwarded-proto",
        b"expect",  # 100-continue is answered by the proxy's server, hop by hop
    }
)


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Header names listed in ``Connection`` (they are hop-by-hop too)."""
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            names.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return frozenset(names)


def _forwarded_node(host: str) -> str:
    # RFC 7239: IPv6 addresses are quoted and bracketed.
    return f'"[{host}]"' if ":" in host else host


def request_headers(
    scope: dict[str, Any] | Any,
    host_header: str,
    remaining_deadline: float | None,
) -> list[tuple[str, str]]:
    """The headers to send upstream for this ASGI request."""
    raw: Sequence[tuple[bytes, bytes]] = scope.get("headers", ())
    dropped = HOP_BY_HOP | _REPLACED | _connection_tokens(raw)
    headers: list[tuple[str, str]] = [("Host", host_header)]
    forwarded_for = ""
    forwarded = ""
    client_host = ""
    original_host = ""
    for name, value in raw:
        lower = name.lower()
        if lower == b"host":
            original_host = value.decode("latin-1")
        if lower in dropped or is_proxy_header(lower):
            continue
        if lower == b"x-forwarded-for":
            forwarded_for = value.decode("latin-1")
            continue
        if lower == b"forwarded":
            forwarded = value.decode("latin-1")
            continue
        headers.append((name.decode("latin-1"), value.decode("latin-1")))
    client = scope.get("client")
    if client:
        client_host = str(client[0])
    if client_host:
        headers.append(
            ("X-Forwarded-For", f"{forwarded_for}, {client_host}" if forwarded_for else client_host)
        )
        element = f"for={_forwarded_node(client_host)};proto={scope.get('scheme', 'http')}"
        if original_host and '"' not in original_host:
            element += f';host="{original_host}"'
        headers.append(("Forwarded", f"{forwarded}, {element}" if forwarded else element))
    else:  # no peer address (a unix socket): keep what the client sent
        if forwarded_for:
            headers.append(("X-Forwarded-For", forwarded_for))
        if forwarded:
            headers.append(("Forwarded", forwarded))
    if original_host:
        headers.append(("X-Forwarded-Host", original_host))
    headers.append(("X-Forwarded-Proto", str(scope.get("scheme", "http"))))
    if remaining_deadline is not None:
        headers.append(("X-Request-Timeout", f"{max(remaining_deadline, 0.001):.3f}"))
    return headers


def response_headers(raw: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers without hop-by-hop ones (Retry-After kept)."""
    dropped = HOP_BY_HOP | _connection_tokens(raw)
    kept = []
    for name, value in raw:
        lower = name.lower()
        if lower not in dropped and not is_proxy_header(lower):
            kept.append((lower, value))
    return kept
