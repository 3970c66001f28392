"""What keeps the proxy from being an open proxy or a memory sink.

- Only configured upstreams are ever contacted: the upstream comes from the pool,
  never from the request. A request whose target is not origin-form (``/path``) is
  refused with 400: ``GET http://evil/ HTTP/1.1`` (absolute-form), ``CONNECT
  host:443`` (authority-form) and ``OPTIONS *``.
- A path never climbs out of the upstream's prefix: :func:`safe_path` resolves
  dot segments (``.``, ``..``, also percent-encoded) before the prefix is put in
  front, and refuses (400) a path whose ``..`` would climb above ``/`` or that hides
  a dot segment behind an encoded slash or a backslash (``/..%2f``, ``/..\\``).
- httptools, uvicorn's fast parser, hands the app only the *path* of an
  absolute-form target (``GET http://evil/x`` arrives as ``raw_path=b"/x"``), so the
  app alone cannot tell. :func:`bounded_protocol` builds a uvicorn protocol class
  that keeps the original target in ``scope["raw_path"]`` when it is not
  origin-form, and bounds the request line and header block (414 / 431 and the
  connection closed) before uvicorn buffers them. Under h11 ``raw_path`` is the
  target as sent, so the app's check works there too.
- The same protocol bounds the header count (431), the time to receive a request
  head (408: uvicorn has none, its keep-alive timeout only covers the wait between
  requests) and the open connections, closing the oldest idle one to make room (a
  slowloris cannot take every descriptor): see :func:`bounded_protocol`.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any
from urllib.parse import unquote_to_bytes

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = [
    "ClientConnections",
    "bounded_protocol",
    "client_connections",
    "default_max_connections",
    "is_origin_form",
    "safe_path",
]


def is_origin_form(scope: dict[str, Any] | Any) -> bool:
    """True when the request target is ``/path[?query]``, the only form a reverse proxy serves."""
    raw_path = scope.get("raw_path")
    if raw_path is None:
        raw_path = str(scope.get("path", "")).encode("latin-1")
    return bool(raw_path[:1] == b"/") and scope.get("method") != "CONNECT"


_DOT_SEGMENTS = (b".", b"..")


def safe_path(raw_path: bytes) -> bytes | None:
    """``raw_path`` (origin-form, as sent) with its dot segments resolved, or None to refuse.

    Resolves ``.`` and ``..`` segments as RFC 3986 section 5.2.4 does, counting
    ``%2e`` as a dot: ``/a/./b/../c`` becomes ``/a/c``. Returns None when a ``..``
    would climb above ``/`` (``/../secret``, ``/%2e%2e/secret``, ``/a/../../x``) or when
    a segment hides a dot segment behind an encoded slash or a backslash (``/..%2fx``,
    ``/..\\x``), which an upstream that decodes first would resolve. Other segments
    are kept exactly as sent (still percent-encoded).
    """
    if b"/." not in raw_path and b"%" not in raw_path and b"\\" not in raw_path:
        return raw_path  # no dot segment can hide in it: the common case, untouched
    segments = raw_path.split(b"/")[1:]
    kept: list[bytes] = []
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        decoded = unquote_to_bytes(segment) if b"%" in segment else segment
        if decoded in _DOT_SEGMENTS:
            if decoded == b"..":
                if not kept:
                    return None  # above the root: out of the upstream's prefix
                kept.pop()
            if index == last:
                kept.append(b"")  # "/a/b/.." is "/a/": a directory
            continue
        if b"/" in decoded or b"\\" in decoded:
            pieces = decoded.replace(b"\\", b"/").split(b"/")
            if any(piece in _DOT_SEGMENTS for piece in pieces):
                return None
        kept.append(segment)
    return b"/" + b"/".join(kept)


class _HeadTooLarge(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


_STATUS_TEXT = {
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
# Room for the method, version and line ends around the bounded target and headers.
_HEAD_SLACK = 1024
_RESERVED_DESCRIPTORS = 64
# After an error answer, how long the connection may stay half-closed for the client
# to read it (what it still sends is discarded).
_LINGER_SECONDS = 1.0
# How long a connection whose client has sent nothing yet is kept from being closed to
# make room (ClientConnections): long enough for a busy loop to read it.
_UNREAD_GRACE = 0.1


def default_max_connections() -> int:
    """Open client connections the descriptor limit (``RLIMIT_NOFILE``) leaves room for.

    A proxied request holds two descriptors (the client's connection and one to the
    upstream), and the process needs some for itself (listeners, the event loop,
    logs, probes): ``(limit - 64) // 2``, at least 16. ``ulimit -n 1024`` gives 480.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 1 << 20:
        soft = 1 << 20
    return max(16, (soft - _RESERVED_DESCRIPTORS) // 2)


class ClientConnections:
    """One server's open client connections, and the idle ones among them, oldest first.

    ``evicted``, ``refused`` and ``timed_out`` count connections closed to make room,
    refused with 503, and answered 408 (head not complete in time); the proxy exports
    them as metrics.

    A connection is idle while it reads a request head or waits for the next request
    on a kept-alive connection: closing it loses no work. When a new connection would
    go over the bound, the oldest idle one is closed to make room; with none idle
    (every connection has a request in progress) the new one is refused with 503.

    A connection is *unread* from its accept until its client's first bytes are read,
    for at most ``unread_grace`` seconds: under a flood of reconnects the oldest idle
    connection can be only milliseconds old, and a client that sent its request at once
    would otherwise be closed for room before the loop got to read it. Unread connections
    are not closed to make room; when every idle connection is unread, the new one is
    refused.
    """

    __slots__ = (
        "evicted", "idle", "limit", "open", "refused", "timed_out", "unread", "unread_grace",
    )  # fmt: skip

    def __init__(self, limit: int, unread_grace: float = _UNREAD_GRACE) -> None:
        self.limit = limit
        self.unread_grace = unread_grace
        self.open: dict[_BoundedHttpToolsProtocol, None] = {}
        self.idle: dict[_BoundedHttpToolsProtocol, None] = {}
        # Unread connections and when they were accepted (loop time).
        self.unread: dict[_BoundedHttpToolsProtocol, float] = {}
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0

    def admit(self, connection: _BoundedHttpToolsProtocol, now: float) -> bool:
        """Count a new (unread) connection in, accepted at loop time ``now``; False when
        it must be refused."""
        if len(self.open) >= self.limit and not self._evict_one(now):
            self.refused += 1
            return False
        self.open[connection] = None
        self.idle[connection] = None
        self.unread[connection] = now
        return True

    def read(self, connection: _BoundedHttpToolsProtocol) -> None:
        """The client's first bytes have been read."""
        self.unread.pop(connection, None)

    def _evict_one(self, now: float) -> bool:
        """Close the oldest idle connection that is not unread within its grace."""
        unread, since = self.unread, now - self.unread_grace
        for victim in self.idle:
            accepted = unread.get(victim)
            if accepted is None or accepted <= since:
                break
        else:
            return False
        self.evicted += 1
        self.closed(victim)
        victim.transport.close()
        return True

    def busy(self, connection: _BoundedHttpToolsProtocol) -> None:
        """A request head is complete: the connection has work in progress."""
        self.idle.pop(connection, None)

    def resting(self, connection: _BoundedHttpToolsProtocol) -> None:
        """The last response is complete: idle again, newest of the idle."""
        if connection in self.open:
            self.idle.pop(connection, None)
            self.idle[connection] = None

    def closed(self, connection: _BoundedHttpToolsProtocol) -> None:
        """The connection is gone (or handed to another protocol)."""
        self.open.pop(connection, None)
        self.idle.pop(connection, None)
        self.unread.pop(connection, None)


class _BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads and the raw target kept,
    a time limit on each request head, and a bound on open connections."""

    max_request_line = 8192
    max_header_bytes = 65536
    max_headers = 100
    header_timeout: float | None = 10.0
    connections_bound: ClientConnections | None = None  # one per server: see bounded_protocol
    _head_error: _HeadTooLarge | None = None
    _header_bytes = 0
    _header_count = 0
    _head_raw_bytes = 0
    _in_head = False
    _head_timer: asyncio.TimerHandle | None = None
    _admitted = False
    _lingering = False
    _linger_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        bound = self.connections_bound
        if bound is not None:
            if not bound.admit(self, self.loop.time()):
                self._refuse()
                return
            self._admitted = True
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        if self._admitted and self.connections_bound is not None:
            self.connections_bound.closed(self)
        super().connection_lost(exc)

    def _refuse(self) -> None:
        self._answer_and_close(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"retry-after: 1\r\ncontent-length: 22\r\nconnection: close\r\n\r\n"
            b"too many open requests"
        )

    def _answer_and_close(self, response: bytes) -> None:
        """Send ``response``, then close without losing it: half-close, discard what
        the client still sends, close when it does or after a second. Closing at once
        with its request unread would reset the connection, and the client's system
        may drop the answer it has not read yet."""
        self._in_head = False
        self._stop_head_timer()
        self._lingering = True
        transport = self.transport
        transport.write(response)
        if transport.can_write_eof():
            transport.write_eof()
            self._linger_timer = self.loop.call_later(_LINGER_SECONDS, transport.close)
        else:  # pragma: no cover - TCP transports can
            transport.close()

    def handle_websocket_upgrade(self) -> None:
        self._stop_head_timer()
        if self._admitted and self.connections_bound is not None:
            self.connections_bound.closed(self)  # another protocol owns it from now on
            self._admitted = False
        super().handle_websocket_upgrade()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        bound = self.connections_bound
        cycle = self.cycle
        if bound is not None and (cycle is None or cycle.response_complete):
            bound.resting(self)

    # ------------------------------------------------------------ the head

    def _start_head(self) -> None:
        self._in_head = True
        self._head_raw_bytes = 0
        if self.header_timeout is not None and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            if self.connections_bound is not None:
                self.connections_bound.timed_out += 1
            reason = f"request head not complete within {self.header_timeout:g}s"
            self._send_head_error(_HeadTooLarge(408, reason))

    def data_received(self, data: bytes) -> None:
        if self._admitted and self.connections_bound is not None:
            self.connections_bound.read(self)
        if self._lingering:
            return  # answered and closing: what the client still sends is discarded
        in_head = self._in_head
        super().data_received(data)
        if in_head and self._in_head:
            # The whole chunk was head. httptools keeps a header's pieces until the
            # header ends, so count raw bytes too: one endless header is bounded.
            self._head_raw_bytes += len(data)
            bound = self.max_request_line + self.max_header_bytes + _HEAD_SLACK
            if self._head_raw_bytes > bound and not self.transport.is_closing():
                reason = f"request head over {bound} bytes"
                self._send_head_error(_HeadTooLarge(431, reason))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._header_count = 0
        self._head_error = None
        if not self._in_head:
            self._start_head()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.max_request_line:
            self._fail(414, f"request target over {self.max_request_line} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.max_header_bytes:
            self._fail(431, f"request headers over {self.max_header_bytes} bytes")
        self._header_count += 1
        if self._header_count > self.max_headers:
            self._fail(431, f"more than {self.max_headers} request headers")
        super().on_header(name, value)

    def _fail(self, status: int, reason: str) -> None:
        # Raising stops the parser; uvicorn catches the parser error and calls
        # send_400_response, which sends this status instead.
        self._head_error = _HeadTooLarge(status, reason)
        raise self._head_error

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        if self.connections_bound is not None:
            self.connections_bound.busy(self)
        super().on_headers_complete()
        if self.url[:1] != b"/":
            # Keep the target as sent so the app can refuse it (httptools kept only its path).
            self.scope["raw_path"] = self.url

    def send_400_response(self, msg: str) -> None:
        error = self._head_error
        if error is None:
            super().send_400_response(msg)
            return
        self._send_head_error(error)

    def _send_head_error(self, error: _HeadTooLarge) -> None:
        body = error.reason.encode()
        self._answer_and_close(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (error.status, _STATUS_TEXT[error.status], len(body), body)
        )


def bounded_protocol(
    max_request_line: int = 8192,
    max_header_bytes: int = 65536,
    *,
    max_headers: int = 100,
    header_timeout: float | None = 10.0,
    max_connections: int | None = None,
) -> type[Any]:
    """A uvicorn ``http=`` protocol class (httptools) with these bounds; see the module doc.

    Request heads are bounded in size (414 / 431), in header count (431) and in time:
    ``header_timeout`` seconds from the connection's start, or from the first byte of a
    later request on a kept-alive connection, to the end of the head (408 and the
    connection closed). Open connections are bounded by ``max_connections``
    (default :func:`default_max_connections`; see :class:`ClientConnections`). Build one
    class per server: the connection bound is the class's.
    """

    class BoundedHttpToolsProtocol(_BoundedHttpToolsProtocol):
        pass

    BoundedHttpToolsProtocol.max_request_line = max_request_line
    BoundedHttpToolsProtocol.max_header_bytes = max_header_bytes
    BoundedHttpToolsProtocol.max_headers = max_headers
    BoundedHttpToolsProtocol.header_timeout = header_timeout
    limit = default_max_connections() if max_connections is None else max_connections
    BoundedHttpToolsProtocol.connections_bound = ClientConnections(limit)
    return BoundedHttpToolsProtocol


def client_connections(protocol: type[Any] | str) -> ClientConnections | None:
    """The connection bound of a protocol class from :func:`bounded_protocol` (None for
    any other ``http=`` setting)."""
    bound = getattr(protocol, "connections_bound", None)
    return bound if isinstance(bound, ClientConnections) else None
