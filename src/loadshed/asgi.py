"""``LoadShedMiddleware``: admission control for any ASGI app, as pure ASGI.

    app.add_middleware(LoadShedMiddleware)            # FastAPI / Starlette
    app = LoadShedMiddleware(app, limit="little")     # any ASGI app

Each HTTP request is admitted, queued or refused by a :class:`Limiter`:
- refused at once with 503 (or 429), a small JSON body and ``Retry-After``, without
  reading the request body;
- while queued, the request body is read (bounded) and the connection watched: a
  client that disconnects leaves the queue at once (``client_gone``) and teaches
  the limiter its patience; once admitted the app gets the buffered body replayed;
- after the app answers, the outcome goes back to the limit: 5xx, answers past
  the request's deadline and answers to a client that already left are drops,
  4xx are ignored, the rest are successes;
- ``Server-Timing: queue;dur=..., app;dur=...`` tells the client where time went.

The app finds its token in ``scope["loadshed.token"]`` and may release it first
with its own outcome (a proxy marks an upstream 429 as dropped, for instance).

The deadline comes from ``X-Request-Timeout`` (seconds) or ``grpc-timeout``, or
the route's default; the priority from ``X-Priority``. Malformed values are
ignored and counted (``malformed_headers``), never answered with a 500.

Shutdown: :meth:`LoadShedMiddleware.shutdown` answers every queued request, and every
later one, 503 + ``Retry-After`` (reason ``shutdown``) at once; requests already
running finish. It runs when the server begins to stop: at SIGTERM or SIGINT when the
server handles those signals in Python (uvicorn, gunicorn's workers: the middleware
chains onto the handler it finds at lifespan start-up), else at the lifespan shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from loadshed.admission import Token
from loadshed.asgitypes import ASGIApp, Message, Receive, Scope, Send
from loadshed.checks import check_int, check_number, check_optional_number
from loadshed.config import AdmissionConfig
from loadshed.deadline import HeaderError, parse_grpc_timeout, parse_priority, parse_timeout_seconds
from loadshed.errors import (
    REFUSAL_STATUSES,
    ConfigError,
    Outcome,
    Priority,
    Rejected,
    RejectReason,
)
from loadshed.limiter import Limiter, Waiting, WorkerPool
from loadshed.limits.base import LimitAlgorithm
from loadshed.pacing import DEFAULT_REFUSAL_PACING, RefusalPacer, RefusalPacing

if TYPE_CHECKING:
    from loadshed.metrics import LoadshedMetrics  # prometheus_client loads on first use

__all__ = ["LoadShedMiddleware", "RouteSelector"]

RouteSelector = Callable[[Scope], "Limiter | None"]
"""Chooses the limiter for a request, or None to let it through unprotected."""

_logger = logging.getLogger("loadshed.asgi")
# Per-request paths read enum members from plain names (~6 ns) rather than through
# their class (~70 ns on CPython 3.11).
_SUCCESS: Final = Outcome.SUCCESS
_DROPPED: Final = Outcome.DROPPED
_IGNORED: Final = Outcome.IGNORED
_DEFAULT_PRIORITY: Final = Priority.DEFAULT
_SHUTDOWN: Final = RejectReason.SHUTDOWN
_SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class LoadShedMiddleware:
    """Pure ASGI admission-control middleware; see the module docstring.

    Parameters:
        app: the ASGI app to protect.
        limit: algorithm or spec for the default limiter (None: ``little``);
            ignored when ``limiter`` is given.
        limiter: a ready :class:`Limiter` to use for every protected route.
        runner: a :class:`~loadshed.runner.ModelRunner` whose live worker count is
            the default limiter's limit (``Limiter(runner=...)``); not with ``limit``
            or ``limiter``. Routes given their own limiter in ``routes`` do not use it.
        routes: path prefix -> limiter (or a limit spec) for routes with their own
            limiter; the longest matching prefix wins.
        exclude: path prefixes that are never limited (health checks, metrics), or
            a callable ``scope -> bool``.
        select: a callable ``scope -> Limiter | None`` that overrides ``routes``.
        reject_status: 503 (default) or 429.
        max_body_bytes: larger bodies get 413 without being buffered: a declared
            Content-Length on arrival, a chunked body (``Transfer-Encoding``) once the
            app has read that much (the app then reads ``http.disconnect``; if it had
            begun its answer already, it may finish it).
        default_timeout: deadline in seconds for requests that send none.
        deadline_header / grpc_timeout_header / priority_header: header names.
        server_timing: add the ``Server-Timing`` response header.
        disconnect_watch_after: seconds a request lasts (queued or running) before
            its connection is watched for a disconnect; 0 watches from the next loop
            iteration. Default 5 ms: most requests to a busy but healthy server end
            sooner, and watching costs a task per request. A client that leaves
            while queued leaves the queue (``client_gone``); one that leaves while
            the app works makes the request a drop, and both teach the patience.
        limiter_options: keyword arguments for limiters the middleware builds.
        config: the admission settings (:class:`~loadshed.config.AdmissionConfig`)
            of the limiters the middleware builds (the default one and those of
            ``routes`` given as a spec).
        refusal_pacing: when refusals come faster than its ``rate`` (default 500
            per second), hold each further one for a bounded time before its 503
            (:mod:`loadshed.pacing`), so that clients retrying at once cannot spend
            the CPU the app needs; None answers every refusal at once. Shutdown
            refusals are never held.
        metrics: export every limiter here to this :class:`LoadshedMetrics`.
        metrics_path: serve those metrics at this exact path (never limited);
            needs ``metrics`` (one is created if omitted).
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: LimitAlgorithm | str | int | None = None,
        *,
        limiter: Limiter | None = None,
        runner: WorkerPool | None = None,
        routes: Mapping[str, Limiter | LimitAlgorithm | str | int] | None = None,
        exclude: Iterable[str] | Callable[[Scope], bool] = ("/health", "/metrics"),
        select: RouteSelector | None = None,
        reject_status: int = 503,
        max_body_bytes: int = 1 << 20,
        default_timeout: float | None = None,
        deadline_header: str = "x-request-timeout",
        grpc_timeout_header: str = "grpc-timeout",
        priority_header: str = "x-priority",
        server_timing: bool = True,
        disconnect_watch_after: float = 0.005,
        limiter_options: Mapping[str, Any] | None = None,
        config: AdmissionConfig | None = None,
        metrics: LoadshedMetrics | None = None,
        metrics_path: str | None = None,
        refusal_pacing: RefusalPacing | None = DEFAULT_REFUSAL_PACING,
    ) -> None:
        if (
            isinstance(reject_status, bool)
            or not isinstance(reject_status, int)
            or reject_status not in REFUSAL_STATUSES
        ):
            raise ConfigError("reject_status", f"got {reject_status!r}, allowed: 429|503")
        max_body_bytes = check_int("max_body_bytes", max_body_bytes, minimum=0)
        disconnect_watch_after = check_number(
            "disconnect_watch_after", disconnect_watch_after, minimum=0, unit="seconds"
        )
        default_timeout = check_optional_number(
            "default_timeout", default_timeout, minimum=0, min_open=True, unit="seconds"
        )
        for field, header in (
            ("deadline_header", deadline_header),
            ("grpc_timeout_header", grpc_timeout_header),
            ("priority_header", priority_header),
        ):
            if not isinstance(header, str) or not header:
                raise ConfigError(field, f"must be a header name, got {header!r}")
        options = dict(limiter_options or {})
        if config is not None:
            options["config"] = config
        if runner is not None and limiter is not None:
            raise ConfigError("runner", "give runner= to the Limiter you pass as limiter=")
        self.app = app
        self.limiter = limiter if limiter is not None else Limiter(limit, runner=runner, **options)
        self.routes: list[tuple[str, Limiter]] = sorted(
            (
                (
                    prefix,
                    value if isinstance(value, Limiter) else Limiter(value, name=prefix, **options),
                )
                for prefix, value in (routes or {}).items()
            ),
            key=lambda item: len(item[0]),
            reverse=True,
        )
        self._exclude_callable: Callable[[Scope], bool] | None = None
        self._exclude_prefixes: tuple[str, ...] = ()
        if callable(exclude):
            self._exclude_callable = exclude
        else:
            self._exclude_prefixes = tuple(exclude)
        self._select = select
        self.reject_status = reject_status
        self.max_body_bytes = max_body_bytes
        self.default_timeout = default_timeout
        self._deadline_header = deadline_header.lower().encode("latin-1")
        self._grpc_header = grpc_timeout_header.lower().encode("latin-1")
        self._priority_header = priority_header.lower().encode("latin-1")
        self._watched_headers = frozenset(
            (
                b"content-length",
                b"transfer-encoding",
                self._deadline_header,
                self._grpc_header,
                self._priority_header,
            )
        )
        self.server_timing = server_timing
        self.disconnect_watch_after = disconnect_watch_after
        self._watches = _Watches(disconnect_watch_after)
        self.malformed_headers: dict[str, int] = {}
        """Counts of malformed header values seen, by header name."""
        if metrics_path is not None and metrics is None:
            from loadshed.metrics import LoadshedMetrics

            metrics = LoadshedMetrics()
        self.metrics = metrics
        self.metrics_path = metrics_path
        self._metrics_app = metrics.asgi_app() if metrics is not None else None
        if metrics is not None:
            metrics.track_middleware(self)
        self._reject_answers: dict[RejectReason, tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = {}
        for reason in RejectReason:
            error = "shutting_down" if reason is _SHUTDOWN else "overloaded"
            body = json.dumps({"error": error, "reason": reason.value}).encode()
            length = b"%d" % len(body)
            headers: tuple[tuple[bytes, bytes], ...] = (
                (b"content-type", b"application/json"),
                (b"content-length", length),
            )
            if reason is _SHUTDOWN:  # the client should reconnect elsewhere
                headers = (*headers, (b"connection", b"close"))
            self._reject_answers[reason] = (body, headers)
        if refusal_pacing is not None and not isinstance(refusal_pacing, RefusalPacing):
            raise ConfigError(
                "refusal_pacing",
                f"expected a RefusalPacing or None, got {type(refusal_pacing).__name__}",
            )
        self.pacer: RefusalPacer | None = (
            RefusalPacer(refusal_pacing) if refusal_pacing is not None else None
        )
        """Holds refusals beyond the pacing rate (None: pacing off)."""
        self._also_close: list[Limiter] = []
        self._signals_hooked = False
        self.shutting_down = False
        """True once :meth:`shutdown` ran: every request it guards gets 503 (shutdown)."""

    @property
    def limiters(self) -> list[Limiter]:
        """Every limiter this middleware uses (default first)."""
        return [self.limiter, *(limiter for _, limiter in self.routes)]

    @property
    def refusals_held(self) -> int:
        """Refusals held before their answer by refusal pacing, since creation (0: off)."""
        return self.pacer.held_total if self.pacer is not None else 0

    @property
    def refusal_hold_seconds(self) -> float:
        """Seconds of hold given to paced refusals, since creation (0.0: pacing off)."""
        return self.pacer.hold_seconds_total if self.pacer is not None else 0.0

    def close_on_shutdown(self, limiter: Limiter) -> None:
        """Also close ``limiter`` in :meth:`shutdown` (one that ``select`` returns)."""
        for known in (*self.limiters, *self._also_close):
            if limiter is known:
                return
        self._also_close.append(limiter)

    def shutdown(self) -> int:
        """The server is stopping: answer every queued request, and every later one,
        503 + ``Retry-After`` (reason ``shutdown``) at once; running requests finish.

        Closes every limiter (:meth:`Limiter.close`). Returns how many queued requests
        were refused; calling it again does no harm.
        """
        self.shutting_down = True
        refused = 0
        for limiter in (*self.limiters, *self._also_close):
            refused += limiter.close()
        return refused

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the lifespan through to the app, watching its start-up and shutdown."""

        async def watched() -> Message:
            message = await receive()
            kind = message.get("type")
            if kind == "lifespan.startup":
                self._hook_signals()
            elif kind == "lifespan.shutdown":
                self.shutdown()  # late (the server waited for requests first), harmless
            return message

        await self.app(scope, watched, send)

    def _hook_signals(self) -> None:
        """Call :meth:`shutdown` as soon as SIGTERM or SIGINT arrives, before the
        server's own handler (which stops accepting and waits for requests in
        flight): chained onto a Python handler the server installed, never replacing
        the default action or an ignored signal."""
        if self._signals_hooked or threading.current_thread() is not threading.main_thread():
            return
        self._signals_hooked = True
        loop = asyncio.get_running_loop()
        for sig in _SHUTDOWN_SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                signal.signal(sig, _ShutdownHook(self, loop, previous))

    def limiter_for(self, scope: Scope) -> Limiter | None:
        """The limiter that guards this request, or None when it is not limited."""
        path: str = scope.get("path", "")
        if self._exclude_callable is not None:
            if self._exclude_callable(scope):
                return None
        elif path.startswith(self._exclude_prefixes):
            return None
        if self._select is not None:
            return self._select(scope)
        if not self.routes:
            return self.limiter
        for prefix, limiter in self.routes:
            if path.startswith(prefix):
                return limiter
        return self.limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # This runs for every request: keep it to a few attribute reads and calls.
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if self._metrics_app is not None and scope.get("path") == self.metrics_path:
            await self._metrics_app(scope, receive, send)
            return
        limiter = self.limiter_for(scope)
        if limiter is None:
            await self.app(scope, receive, send)
            return

        timeout, priority, content_length, has_body = self._read_headers(scope)
        if content_length is not None and content_length > self.max_body_bytes:
            await _send_too_large(send, self.max_body_bytes)
            return
        now = limiter.admission.now
        deadline = None if timeout is None else now() + timeout
        watch: _Watch | None = None
        try:
            # A free slot at once (the common case: no future made), queued, or refused.
            entry = limiter.enter(priority=priority, deadline=deadline)
        except Rejected as rejected:
            await self._send_rejection(send, rejected, now)
            return
        token: Token | None
        if isinstance(entry, Token):
            token = entry
        else:
            # Watched from the queue on (see _wait_in_queue), through to the end.
            watch = _Watch(receive, send, self.max_body_bytes, has_body, now, now())
            token = await self._wait_in_queue(entry, watch, send, now)
            if token is None:
                return
        if watch is None:
            # Watches the connection once the request has lasted disconnect_watch_after;
            # the app reads and answers through it.
            watch = _Watch(receive, send, self.max_body_bytes, has_body, now, token.admitted_at)
            self._watches.add(watch)
        if self.server_timing:
            watch.timing = token
        scope["loadshed.token"] = token  # lets the app record its own outcome first
        # A chunked body (no Content-Length) is counted as the app reads it: past the
        # bound the client gets 413 (a declared length was checked on arrival).
        receive = watch.receive if content_length is not None or not has_body else watch.bounded
        try:
            await self.app(scope, receive, watch.send)
        except asyncio.CancelledError:
            token.release(_IGNORED)
            raise
        except Exception as error:
            if watch.over_bound:
                # The app was told the client left once the body went over the bound
                # (the client got 413 if the app had not answered yet): its failure
                # to read the rest is expected, and a client error, not the server's.
                token.release(_IGNORED)
                _logger.debug("app failed after a body over max_body_bytes: %r", error)
                return
            token.release(_DROPPED)  # the server answers 500
            raise
        except BaseException:
            token.release(_DROPPED)
            raise
        finally:
            self._watches.finish(watch)
        if watch.gone:
            # The client left while the app worked: the answer reached nobody. An
            # overload sign for the limit, and a give-up that teaches patience.
            token.release(_DROPPED)
            limiter.client_gave_up(watch.gone_after)
        elif (status := watch.status) >= 500 or (deadline is not None and now() > deadline):
            token.release(_DROPPED)
        elif 400 <= status < 500 or status == 0:
            token.release(_IGNORED)
        else:
            token.release(_SUCCESS)

    # ----------------------------------------------------------------- parts

    def _read_headers(self, scope: Scope) -> tuple[float | None, Priority, int | None, bool]:
        """Deadline timeout, priority, Content-Length and whether a body follows."""
        timeout = self.default_timeout
        priority = _DEFAULT_PRIORITY
        content_length: int | None = None
        chunked = False
        deadline_header, grpc_header = self._deadline_header, self._grpc_header
        priority_header, watched = self._priority_header, self._watched_headers
        for name, raw_value in scope.get("headers", ()):
            # ASGI servers give header names in lower case (the spec requires it).
            if name not in watched:
                continue
            try:
                if name == deadline_header:
                    timeout = parse_timeout_seconds(raw_value.decode("latin-1"), name.decode())
                elif name == grpc_header:
                    timeout = parse_grpc_timeout(raw_value.decode("latin-1"), name.decode())
                elif name == priority_header:
                    priority = parse_priority(raw_value.decode("latin-1"), name.decode())
                elif name == b"content-length":
                    content_length = int(raw_value)
                elif name == b"transfer-encoding":
                    chunked = True
            except HeaderError as error:
                self.malformed_headers[error.header] = (
                    self.malformed_headers.get(error.header, 0) + 1
                )
            except ValueError:
                pass  # a bad Content-Length is the server's business, not ours
        has_body = chunked or (content_length is not None and content_length > 0)
        return timeout, priority, content_length, has_body

    async def _wait_in_queue(
        self, waiting: Waiting, watch: _Watch, send: Send, now: Callable[[], float]
    ) -> Token | None:
        """Wait for a token, leaving the queue at once if the client goes.

        Returns the token, or None when the request ended here (client gone,
        rejected, body too large). Watching begins after ``disconnect_watch_after``
        (it costs a task per request, several times an admission, and most waits on
        a busy but healthy server are shorter); while queued, the watch's reader
        buffers the body (bounded) for the app.
        """

        def watch_stopped() -> None:
            # The client left or sent too much: leave the queue at once (a no-op if
            # the token was granted first; then the request ends as the app sees fit).
            waiting.leave(RejectReason.LIMIT if watch.too_large else RejectReason.CLIENT_GONE)

        watch.on_stop = watch_stopped
        watch.queued = True
        self._watches.add(watch)
        try:
            # One future to wait on: granted, rejected by the limiter, or left via the watch.
            token = await waiting.future
        except asyncio.CancelledError:
            waiting.cancel()
            self._watches.finish(watch)
            raise
        except Rejected as rejected:
            self._watches.finish(watch)
            if rejected.reason is RejectReason.CLIENT_GONE:
                return None
            if watch.too_large and rejected.reason is RejectReason.LIMIT:
                await _send_too_large(send, self.max_body_bytes)
            else:
                await self._send_rejection(send, rejected, now)
            return None
        watch.on_stop = None
        watch.queued = False
        return token

    async def _send_rejection(
        self, send: Send, rejected: Rejected, now: Callable[[], float]
    ) -> None:
        # Everything but Retry-After is prepared once per reason: under overload this
        # answers most requests, and its cost bounds how fast refused clients hear.
        reason = rejected.reason
        pacer = self.pacer
        if pacer is not None and reason is not _SHUTDOWN:
            hold = pacer.hold(now(), rejected.retry_after)
            if hold > 0.0:
                pacer.held += 1
                try:
                    await asyncio.sleep(hold)
                finally:
                    pacer.held -= 1
        body, headers = self._reject_answers[reason]
        retry_after = max(1, math.ceil(rejected.retry_after))
        await send(
            {
                "type": "http.response.start",
                "status": 503 if reason is _SHUTDOWN else self.reject_status,
                "headers": [*headers, (b"retry-after", b"%d" % retry_after)],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _ShutdownHook:
    """A signal handler: schedule the middleware's shutdown, then call the previous one."""

    def __init__(
        self,
        middleware: LoadShedMiddleware,
        loop: asyncio.AbstractEventLoop,
        previous: Callable[[int, Any], Any],
    ) -> None:
        self.middleware = middleware
        self.loop = loop
        self.previous = previous

    def __call__(self, signum: int, frame: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already closed
            self.loop.call_soon_threadsafe(self.middleware.shutdown)
        self.previous(signum, frame)


async def _send_too_large(send: Send, max_bytes: int) -> None:
    """Answer 413 and close the connection (the rest of the body is never read)."""
    body = json.dumps(
        {"error": "payload_too_large", "reason": f"body over {max_bytes} bytes"}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Watch:
    """One request's connection: hands the app its messages and notices a disconnect.

    Until :meth:`start`, the app's ``receive`` goes straight to the server's. Once
    started (the request lasted ``disconnect_watch_after``), a :class:`_BodyReader`
    task owns the server's ``receive`` and sees ``http.disconnect``; the app reads
    through its replay. While queued, the reader buffers the body (bounded). Once
    admitted, watching waits until the app has read the body itself, so an upload
    to a slow app keeps the server's flow control rather than filling a buffer.
    A disconnect before the answer was sent sets :attr:`gone`.
    """

    # Defaults live on the class and no __slots__: a request that ends before its
    # watch begins (most of them) sets the few attributes it uses, not all of them.
    _body: _BodyReader | None = None
    _reader: asyncio.Task[None] | None = None
    _inside = 0  # app calls in the server's receive right now
    _due = False  # start() came while it could not begin
    _stopped = False
    queued = False
    """Waiting in the queue: the reader may buffer the body."""
    answered = False
    """The last body message was sent: later disconnects are the normal end."""
    gone = False
    """The client disconnected before the answer was complete."""
    gone_after = 0.0
    """Seconds from arrival to the disconnect (what the client was willing to wait)."""
    on_stop: Callable[[], None] | None = None
    """Called when the reader stops (disconnect or body over the bound)."""
    status = 0
    """The status the app answered with (0: none yet)."""
    timing: Token | None = None
    """The token whose queue wait and app time :meth:`send` reports in Server-Timing."""
    over_bound = False
    """A body of unknown length went over the bound while the app read it."""
    refused = False
    """... and before the app answered: the client got 413, and what the app sends
    goes nowhere."""
    _body_read = 0  # bytes the app has read through :meth:`bounded`

    def __init__(
        self,
        receive: Receive,
        send: Send,
        max_bytes: int,
        has_body: bool,
        now: Callable[[], float],
        since: float,
    ) -> None:
        self._receive = receive
        self._send = send
        self._max_bytes = max_bytes
        self._body_unread = has_body  # the app has not read the whole body yet
        self.now = now
        """Reads the limiter's clock."""
        self.since = since
        """When the request arrived, on the limiter's clock."""

    @property
    def too_large(self) -> bool:
        """The body went over the bound while being buffered."""
        return self._body is not None and self._body.too_large

    def start(self) -> None:
        """Begin watching (a no-op once the request ended or while the app itself is
        waiting in the server's receive: then it sees the disconnect first-hand)."""
        if self._stopped or self._reader is not None:
            return
        if self._inside or (self._body_unread and not self.queued):
            self._due = True  # begin when the app is done reading
            return
        body = _BodyReader(self._receive, self._max_bytes)
        body.on_stop = self._reader_stopped
        self._body = body
        self._reader = asyncio.get_running_loop().create_task(body.read())

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: notes the status, adds Server-Timing, marks the end.

        A plain function handing back the server's awaitable: one coroutine fewer
        per message than an ``async def`` wrapper.
        """
        if self.refused:
            return _nothing()  # the client was answered 413: the app's answer goes nowhere
        if message["type"] == "http.response.start":
            self.status = message["status"]
            token = self.timing
            if token is not None:
                app_ms = (self.now() - token.admitted_at) * 1000.0
                timing = b"queue;dur=%.1f, app;dur=%.1f" % (token.queue_wait * 1000.0, app_ms)
                # A new message and header list: an app may send the same dict every time.
                headers = [*message.get("headers", ()), (b"server-timing", timing)]
                message = {**message, "headers": headers}
        elif not message.get("more_body", False):
            self.answered = True  # a disconnect from here on is the normal end
        return self._send(message)

    async def receive(self) -> Message:
        """The app's ``receive``."""
        if self._body is not None:
            return await self._body.replay()
        self._inside += 1
        try:
            message = await self._receive()
        except BaseException:  # e.g. the app polls with a timeout: watch in its place
            self._inside -= 1
            if self._due and not self._inside and not self._body_unread:
                self.start()
            raise
        self._inside -= 1
        if message["type"] == "http.disconnect":
            self._client_left()
        elif not message.get("more_body", False):
            self._body_unread = False
        if self._due and not self._inside and not self._body_unread:
            self.start()
        return message

    async def bounded(self) -> Message:
        """The app's ``receive`` for a body of unknown length: once the body read goes
        over the bound, the client gets 413 (unless the app has begun its answer) and
        the app ``http.disconnect``, as if the client had left."""
        if self.over_bound:
            return {"type": "http.disconnect"}
        message = await self.receive()
        if message["type"] == "http.request":
            self._body_read += len(message.get("body", b""))
            if self._body_read > self._max_bytes:
                self.over_bound = True
                if self.status == 0:  # else the app's answer has begun: it may finish it
                    # Marked before sending: from here on the app's own sends (another
                    # task of the app may be answering right now) go nowhere.
                    self.status = 413
                    self.answered = True
                    self.refused = True
                    await _send_too_large(self._send, self._max_bytes)
                return {"type": "http.disconnect"}
        return message

    def _client_left(self) -> None:
        if not self.answered and not self.gone:
            self.gone = True
            self.gone_after = self.now() - self.since

    def _reader_stopped(self) -> None:
        body = self._body
        assert body is not None
        if body.messages and body.messages[-1]["type"] == "http.disconnect":
            self._client_left()
        if self.on_stop is not None:
            self.on_stop()


async def _nothing() -> None:
    """An awaitable that does nothing (a message dropped after a 413)."""


class _Watches:
    """Requests in progress; starts watching those that have lasted ``delay``.

    A timer per request costs more than admitting it (a timer handle, heap
    operations, a cancel). Here a request costs a set insertion and removal, and
    one timer sweeps every ``delay`` seconds while any request is in progress,
    starting the watch of those that have lasted ``delay`` (so a watch begins
    between ``delay`` and twice that after the request arrived).
    """

    __slots__ = ("_active", "_delay", "_loop", "_timer")

    def __init__(self, delay: float) -> None:
        self._delay = delay
        self._active: set[_Watch] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, watch: _Watch) -> None:
        """Watch this request's connection once it has lasted ``delay``."""
        if self._delay == 0:
            watch.start()
            return
        self._active.add(watch)
        loop = asyncio.get_running_loop()
        if self._timer is None or loop is not self._loop:  # none yet, or a new loop
            self._loop = loop
            self._timer = loop.call_later(self._delay, self._sweep)

    def finish(self, watch: _Watch) -> None:
        """The request is over: forget it and stop its watch."""
        self._active.discard(watch)
        watch._stopped = True
        if watch._reader is not None:
            watch._reader.cancel()

    def _sweep(self) -> None:
        self._timer = None
        delay = self._delay
        due = [watch for watch in self._active if watch.now() - watch.since >= delay]
        for watch in due:
            self._active.discard(watch)
            watch.start()
        if self._active and self._loop is not None:
            self._timer = self._loop.call_later(self._delay, self._sweep)


class _BodyReader:
    """Reads a queued request's messages (body bounded) until the client leaves.

    While the request waits, this is what notices a disconnect. After admission it
    keeps reading on the app's behalf and :meth:`replay` hands the app every
    message in order, the buffered body first.
    """

    def __init__(self, receive: Receive, max_bytes: int) -> None:
        self._receive = receive
        self._max_bytes = max_bytes
        self._arrived = asyncio.Event()
        self.messages: list[Message] = []
        self.size = 0
        self.too_large = False
        self.stopped = False
        self.on_stop: Callable[[], None] | None = None
        """Called once when reading stops (disconnect or body over the bound)."""
        self._index = 0

    async def read(self) -> None:
        """Read until ``http.disconnect`` or a body over the bound, then call ``on_stop``.

        A failing ``receive`` counts as a disconnect: nothing more can be watched.
        """
        try:
            while True:
                message = await self._receive()
                self.messages.append(message)
                if message["type"] == "http.disconnect":
                    break
                self.size += len(message.get("body", b""))
                if self.size > self._max_bytes:
                    self.too_large = True
                    break
                self._arrived.set()
        except Exception:
            pass  # the server's own error handling reports it; here it ends the watch
        finally:  # also on cancellation, so a replay never waits forever
            self.stopped = True
            self._arrived.set()
        if self.on_stop is not None:
            self.on_stop()

    async def replay(self) -> Message:
        """The app's receive: buffered messages in order, waiting for the next if needed."""
        while self._index >= len(self.messages):
            if self.stopped:
                if self.messages and self.messages[-1]["type"] == "http.disconnect":
                    return self.messages[-1]
                return await self._receive()  # admitted with a body over the bound
            self._arrived.clear()
            await self._arrived.wait()
        message = self.messages[self._index]
        self._index += 1
        return message
