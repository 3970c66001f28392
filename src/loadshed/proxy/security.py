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
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["bounded_protocol", "is_origin_form", "safe_path"]


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


_STATUS_TEXT = {414: b"URI Too Long", 431: b"Request Header Fields Too Large"}


class _BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads and the raw target kept."""

    max_request_line = 8192
    max_header_bytes = 65536
    _head_error: _HeadTooLarge | None = None
    _header_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._head_error = None

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.max_request_line:
            self._fail(414, f"request target over {self.max_request_line} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools may deliver one header in pieces; every piece counts.
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes > self.max_header_bytes:
            self._fail(431, f"request headers over {self.max_header_bytes} bytes")
        super().on_header(name, value)

    def _fail(self, status: int, reason: str) -> None:
        # Raising stops the parser; uvicorn catches the parser error and calls
        # send_400_response, which sends this status instead.
        self._head_error = _HeadTooLarge(status, reason)
        raise self._head_error

    def on_headers_complete(self) -> None:
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
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (error.status, _STATUS_TEXT[error.status], len(body), body)
        )
        self.transport.close()


def bounded_protocol(max_request_line: int = 8192, max_header_bytes: int = 65536) -> type[Any]:
    """A uvicorn ``http=`` protocol class (httptools) with these head bounds; see the module doc."""

    class BoundedHttpToolsProtocol(_BoundedHttpToolsProtocol):
        pass

    BoundedHttpToolsProtocol.max_request_line = max_request_line
    BoundedHttpToolsProtocol.max_header_bytes = max_header_bytes
    return BoundedHttpToolsProtocol
