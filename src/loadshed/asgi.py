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
the route's default; the priority from ``X-Priority``; the request's cost (rows,
tokens: see :mod:`loadshed.costmodel`) from ``X-Request-Cost`` or the ``cost``
callable. Malformed values are ignored and counted (``malformed_headers``), never
answered with a 500.

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
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from loadshed.admission import Token
from loadshed.asgitypes import ASGIApp, Message, Receive, Scope, Send
from loadshed.checks import check_int, check_number, check_optional_number
from loadshed.config import AdmissionConfig
from loadshed.costmodel import check_cost
from loadshed.deadline import (
    HeaderError,
    parse_cost,
    parse_grpc_timeout,
    parse_priority,
    parse_timeout_seconds,
)
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
from loadshed.slot import current_token
from loadshed.watch import RequestWatch, RequestWatches, send_too_large

if TYPE_CHECKING:
    from loadshed.metrics import LoadshedMetrics  # prometheus_client loads on first use

__all__ = ["LoadShedMiddleware", "RouteSelector", "app_path"]

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


def app_path(scope: Scope) -> str:
    """The request's path within the app: ``scope["path"]`` without the app's
    ``root_path`` when it starts with it (the ASGI spec has ``path`` include it)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


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
        cost_header: the header that carries a request's cost (a number > 0: rows,
            tokens, pixels; default ``x-request-cost``; None: not read). Once the
            limiter's cost model is fitted, a request with a cost is judged on its own
            predicted service time (deadline, queue wait, ``Retry-After``).
        cost: a callable ``scope -> float | None`` giving a request's cost from its
            scope (path, query, headers), instead of ``cost_header``; None (its
            answer) means no cost. It must not read the body: for a cost that only
            the body tells, have the client send it in ``cost_header``, or admit in
            the handler with ``Limiter.acquire(cost=...)`` after parsing the body.
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
        cost_header: str | None = "x-request-cost",
        cost: Callable[[Scope], float | None] | None = None,
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
        if cost_header is not None and (not isinstance(cost_header, str) or not cost_header):
            raise ConfigError("cost_header", f"must be a header name or None, got {cost_header!r}")
        taken = {
            header.lower(): field
            for field, header in (
                ("deadline_header", deadline_header),
                ("grpc_timeout_header", grpc_timeout_header),
                ("priority_header", priority_header),
            )
        }
        if cost_header is not None and cost_header.lower() in taken:
            # The header would be read as the other one, and the cost never.
            raise ConfigError(
                "cost_header",
                f"must differ from {taken[cost_header.lower()]}, both are {cost_header!r}",
            )
        if cost is not None and not callable(cost):
            raise ConfigError(
                "cost", f"must be a callable scope -> cost, got {type(cost).__name__}"
            )
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
        self._cost = cost
        # Read only without a cost callable (which decides alone).
        self._cost_header = (
            cost_header.lower().encode("latin-1") if cost_header and cost is None else None
        )
        self._watched_headers = frozenset(
            (
                b"content-length",
                b"transfer-encoding",
                self._deadline_header,
                self._grpc_header,
                self._priority_header,
                *((self._cost_header,) if self._cost_header is not None else ()),
            )
        )
        self.server_timing = server_timing
        self.disconnect_watch_after = disconnect_watch_after
        self._watches = RequestWatches(disconnect_watch_after)
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
        """The limiter that guards this request, or None when it is not limited.

        Exclusions and routes match the path within the app: without the
        ``root_path`` it is mounted at (a Ray Serve ``route_prefix``, a Starlette
        ``Mount``, uvicorn's ``--root-path``), when the path starts with it."""
        path = app_path(scope)
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
        if self._metrics_app is not None and app_path(scope) == self.metrics_path:
            await self._metrics_app(scope, receive, send)
            return
        limiter = self.limiter_for(scope)
        if limiter is None:
            await self.app(scope, receive, send)
            return

        timeout, priority, content_length, has_body, cost = self._read_headers(scope)
        if content_length is not None and content_length > self.max_body_bytes:
            await send_too_large(send, self.max_body_bytes)
            return
        if self._cost is not None:
            cost = self._cost_of(scope)
        now = limiter.admission.now
        deadline = None if timeout is None else now() + timeout
        watch: RequestWatch | None = None
        try:
            # A free slot at once (the common case: no future made), queued, or refused.
            entry = limiter.enter(priority=priority, deadline=deadline, cost=cost)
        except Rejected as rejected:
            await self._send_rejection(send, rejected, now)
            return
        token: Token | None
        if isinstance(entry, Token):
            token = entry
        else:
            # Watched from the queue on (see _wait_in_queue), through to the end.
            watch = RequestWatch(receive, send, self.max_body_bytes, has_body, now, now())
            token = await self._wait_in_queue(entry, watch, send, now)
            if token is None:
                return
        if watch is None:
            # Watches the connection once the request has lasted disconnect_watch_after;
            # the app reads and answers through it.
            watch = RequestWatch(
                receive, send, self.max_body_bytes, has_body, now, token.admitted_at
            )
            self._watches.add(watch)
        if self.server_timing:
            watch.timing = token
        scope["loadshed.token"] = token  # lets the app record its own outcome first
        # A chunked body (no Content-Length) is counted as the app reads it: past the
        # bound the client gets 413 (a declared length was checked on arrival).
        receive = watch.receive if content_length is not None or not has_body else watch.bounded
        held = current_token.set(token)  # ModelRunner vacates it when its job is done
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
            current_token.reset(held)
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

    def _read_headers(
        self, scope: Scope
    ) -> tuple[float | None, Priority, int | None, bool, float | None]:
        """Deadline timeout, priority, Content-Length, whether a body follows, and cost."""
        timeout = self.default_timeout
        priority = _DEFAULT_PRIORITY
        content_length: int | None = None
        cost: float | None = None
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
                elif name == self._cost_header:
                    cost = parse_cost(raw_value.decode("latin-1"), name.decode())
            except HeaderError as error:
                self.malformed_headers[error.header] = (
                    self.malformed_headers.get(error.header, 0) + 1
                )
            except ValueError:
                pass  # a bad Content-Length is the server's business, not ours
        has_body = chunked or (content_length is not None and content_length > 0)
        return timeout, priority, content_length, has_body, cost

    def _cost_of(self, scope: Scope) -> float | None:
        """The ``cost`` callable's answer; a failure or a value that is not a number > 0
        is counted (``malformed_headers["cost"]``) and means no cost, never a 500."""
        assert self._cost is not None
        try:
            cost = self._cost(scope)
            return None if cost is None else check_cost(cost)
        except Exception as error:
            count = self.malformed_headers.get("cost", 0)
            self.malformed_headers["cost"] = count + 1
            if not count:
                _logger.warning("the cost callable failed or gave a bad cost: %r", error)
            return None

    async def _wait_in_queue(
        self, waiting: Waiting, watch: RequestWatch, send: Send, now: Callable[[], float]
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
                await send_too_large(send, self.max_body_bytes)
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
