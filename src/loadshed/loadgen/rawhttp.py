"""A lean HTTP/1.1 client for one origin: keep-alive connections on asyncio protocols,
responses parsed by httptools (llhttp, the C parser uvicorn uses).

Why it exists beside aiohttp: measured on the same target (bench/loadgen/client_overhead.py),
aiohttp's per-request work adds ~0.5-1 ms per round trip and costs ~10 % of closed-loop
throughput against wrk on a busy 2-core machine, while a bare asyncio loop stays within ~2 %.
A load generator's own cost shows up in what it measures, so ``--client raw`` (the default
when httptools is installed) sends the one pre-serialised request a run repeats.

It does what a load run needs and no more: one method, URL, header set and body per client;
Content-Length, chunked and close-delimited responses; HEAD; TLS for https; a connection that
is cancelled mid-request (a client timeout) is aborted, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httptools

from loadshed.loadgen.options import REJECTED_STATUSES, RETRY_AFTER
from loadshed.retry import parse_retry_after

__all__ = ["ConnectFailed", "MalformedResponse", "RawHttpClient", "ResponseIncomplete"]


class ConnectFailed(OSError):
    """Opening a connection failed (refused, unreachable, name not resolved)."""


class MalformedResponse(ConnectionError):
    """The server sent something that is not an HTTP/1.x response."""


class ResponseIncomplete(ConnectionResetError):
    """The server closed the connection before the response was complete."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request in flight."""

    __slots__ = (
        "_body_known",
        "_head",
        "_parser",
        "_waiter",
        "closed",
        "keep_alive",
        "retry_after",
        "status",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser: Any = None
        self._waiter: asyncio.Future[int] | None = None
        self._head = False
        self._body_known = False
        self.status = 0
        self.retry_after: bytes | None = None  # the last response's Retry-After header
        self.keep_alive = True
        self.closed = False

    # -- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same API.
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not a TCP socket
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            return  # bytes outside any request: ignored, the connection will not be reused
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.keep_alive = False
            self._fail(MalformedResponse(f"malformed response: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self.status and not self._body_known:
            # A response without Content-Length or chunking ends when the connection does.
            self.keep_alive = False
            waiter.set_result(self.status)
            return
        self._fail(exc or ResponseIncomplete("connection closed before the response ended"))

    # -- httptools callbacks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        parser = self._parser
        self.status = parser.get_status_code()
        self.keep_alive = parser.should_keep_alive()
        if self._head or self.status in (204, 304) or 100 <= self.status < 200:
            self._complete()

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._body_known = True
        elif lowered == b"retry-after":
            self.retry_after = value

    def on_message_complete(self) -> None:
        self._complete()

    # -- request ------------------------------------------------------------------------------

    def _complete(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._parser = None
            waiter.set_result(self.status)

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def roundtrip(self, request: bytes, head: bool) -> int:
        """Send ``request``; return the response status once the whole body has arrived."""
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._head = head
        self._body_known = False
        self.status = 0
        self.retry_after = None
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def abort(self) -> None:
        """Drop the connection at once (a client timeout, an error)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class RawHttpClient:
    """Sends the same request to one origin over a pool of keep-alive connections."""

    def __init__(
        self,
        url: str,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        default_port = self.port == (443 if self.tls else 80)
        host_header = self.host if default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # IPv6 literal
            host_header = f"[{self.host}]" if default_port else f"[{self.host}]:{self.port}"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
        given = {name.lower() for name in (headers or {})}
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if "user-agent" not in given:
            lines.append("User-Agent: loadshed")
        if body is not None or method.upper() in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        self.head = method.upper() == "HEAD"
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self.tls else None
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(
                _Connection,
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self.tls else None,
            )
        except OSError as exc:
            raise ConnectFailed(
                exc.errno, f"cannot connect to {self.host}:{self.port}: {exc}"
            ) from exc
        self._all.add(protocol)
        return protocol

    async def send(self) -> int:
        """Send the request once and return the status. Cancelling it aborts its connection.

        Raises :class:`ConnectFailed` when connecting fails, ``ConnectionResetError`` (or
        :class:`ResponseIncomplete`) when the connection breaks, :class:`MalformedResponse`
        when the bytes are not an HTTP response.
        """
        connection = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                connection = candidate
                break
            self._all.discard(candidate)
        if connection is None:
            connection = await self._connect()
        try:
            status = await connection.roundtrip(self.request, self.head)
        except BaseException:
            connection.abort()
            self._all.discard(connection)
            raise
        if connection.keep_alive and not connection.closed:
            self._idle.append(connection)
        else:
            connection.abort()
            self._all.discard(connection)
        if status in REJECTED_STATUSES:
            RETRY_AFTER.set(parse_retry_after(connection.retry_after))
        return status

    async def close(self) -> None:
        """Close every connection."""
        for connection in self._all:
            connection.abort()
        self._all.clear()
        self._idle.clear()
        await asyncio.sleep(0)
