"""The proxy as an ASGI app: forward each request to the upstream the pool chose.

:func:`create_proxy` wraps :class:`ProxyApp` in :class:`LoadShedMiddleware`, whose
``select=`` asks the pool for an upstream and returns that upstream's limiter, so
admission (fast 503 + Retry-After, queueing, deadlines, priorities, client-gone
while queued) is exactly the in-process middleware's. ``ProxyApp`` then:

- streams the request body from ASGI ``receive`` into aiohttp (an async generator,
  backpressured) and the response chunk by chunk to ASGI ``send``: nothing whole
  is buffered, so chunked and server-sent-event responses flow as they come;
- watches the client for the whole exchange: a client that leaves closes the
  upstream connection (the upstream stops writing to nobody);
- answers 504 when the request's deadline (``X-Request-Timeout`` or ``--deadline``)
  passes before the upstream's response headers, and forwards the time left as
  ``X-Request-Timeout``; by default keeps waiting for the upstream (and holding its
  slot in the limit) until it answers or ``upstream_timeout`` passes, see
  :class:`_Exchange`; the gap between body chunks is bounded by ``read_timeout``;
- releases the token itself when it knows better than the status code: upstream
  429/503, refused, reset and timeout are drops; the middleware treats other 5xx
  as drops and 4xx as ignored.

Keep-alive connections to each upstream are pooled by one aiohttp connector whose
per-upstream cap is the limit algorithm's ``max_limit``: the limiter admits at most
``limit`` requests at a time, so the pool holds as many connections as the
current limit has needed, never a fixed 20.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from yarl import URL

from loadshed.admission import Token
from loadshed.asgi import LoadShedMiddleware
from loadshed.asgitypes import Receive, Scope, Send
from loadshed.clock import Clock
from loadshed.deadline import HeaderError, parse_grpc_timeout, parse_timeout_seconds
from loadshed.errors import REFUSAL_STATUSES, Outcome
from loadshed.limiter import Limiter
from loadshed.limits import make_limit
from loadshed.metrics import LoadshedMetrics
from loadshed.proxy.config import ProxyConfig
from loadshed.proxy.errors import UpstreamFault, classify, error_body, fault_body
from loadshed.proxy.headers import request_headers, response_headers
from loadshed.proxy.pool import Upstream, UpstreamPool
from loadshed.proxy.security import ClientConnections, is_origin_form, safe_path

__all__ = ["ProxyApp", "ProxyMetrics", "create_proxy"]

logger = logging.getLogger("loadshed.proxy")

_UPSTREAM_KEY = "loadshed.upstream"
_PATH_KEY = "loadshed.upstream_path"  # the path to forward: dot segments resolved
_URL_CACHE_SIZE = 1024
_JSON = (b"content-type", b"application/json")
# aiohttp would add these when absent; a proxy must not invent them.
_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


class ProxyMetrics(Collector):
    """Per-upstream counters and health, in the proxy's Prometheus registry.

    - ``loadshed_proxy_upstream_responses_total{upstream,code}``: answers by status;
    - ``loadshed_proxy_upstream_faults_total{upstream,fault}``: refused, reset,
      connect_timeout, timeout, protocol, and proxy_resources (the proxy ran out of
      descriptors for the connection: its own fault, not the upstream's);
    - ``loadshed_proxy_upstream_up{upstream}``: 1 live, 0 marked down;
    - with :attr:`connections` set (the CLI sets it): ``loadshed_proxy_client_connections``
      (open now) and ``loadshed_proxy_client_connections_closed_total{reason}``:
      ``evicted`` (an idle one closed to make room at ``--max-connections``),
      ``refused`` (503, none idle) and ``head_timeout`` (408, ``--header-timeout``).
    """

    connections: ClientConnections | None = None
    """The served protocol's connection bound, when known."""

    def __init__(self, metrics: LoadshedMetrics, pool: UpstreamPool) -> None:
        self.pool = pool
        self.responses = Counter(
            "loadshed_proxy_upstream_responses",
            "Upstream answers by status code.",
            ["upstream", "code"],
            registry=metrics.registry,
        )
        self.faults = Counter(
            "loadshed_proxy_upstream_faults",
            "Failed upstream exchanges by fault.",
            ["upstream", "fault"],
            registry=metrics.registry,
        )
        metrics.registry.register(self)
        self._response_children: dict[tuple[str, int], Any] = {}

    def count_response(self, upstream: str, status: int) -> None:
        """Count one upstream answer (label children cached: labels() takes a lock)."""
        child = self._response_children.get((upstream, status))
        if child is None:
            child = self.responses.labels(upstream, str(status))
            self._response_children[(upstream, status)] = child
        child.inc()

    def collect(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "loadshed_proxy_upstream_up", "1 if the upstream is live, 0 if marked down.",
            labels=["upstream"],
        )  # fmt: skip
        for upstream in self.pool.upstreams:
            up.add_metric([upstream.name], 1.0 if upstream.up else 0.0)
        families: list[Metric] = [up]
        connections = self.connections
        if connections is not None:
            families.append(
                GaugeMetricFamily(
                    "loadshed_proxy_client_connections",
                    "Open client connections.",
                    value=float(len(connections.open)),
                )
            )
            closed = CounterMetricFamily(
                "loadshed_proxy_client_connections_closed",
                "Client connections the proxy closed: evicted (idle, to make room), "
                "refused (503, none idle), head_timeout (408).",
                labels=["reason"],
            )
            closed.add_metric(["evicted"], float(connections.evicted))
            closed.add_metric(["refused"], float(connections.refused))
            closed.add_metric(["head_timeout"], float(connections.timed_out))
            families.append(closed)
        return families


class _Exchange:
    """One request's upstream exchange and what happened to it from outside.

    A client disconnect or the hard time limit cancels the request's task with a
    reason; the task sees CancelledError at its next await (connecting, uploading,
    waiting for headers, streaming) and aiohttp closes the upstream connection.
    Cancelling the task costs nothing per request, unlike a task per exchange.

    With ``hold`` (the default), a request abandoned before the upstream answered
    (the client left, or its deadline passed and it got its 504) is *not* cut off:
    the proxy keeps waiting for the upstream's answer and keeps its slot in the
    limit until then. A server that does not notice disconnects keeps working on
    it anyway, and a limiter that freed the slot early would send it more work
    than the limit allows: the overload the limit is there to prevent.
    """

    __slots__ = (
        "_task",
        "answered",
        "client_gone",
        "headers_received",
        "hold",
        "interrupted",
        "sender",
    )

    def __init__(self, task: asyncio.Task[Any], hold: bool) -> None:
        self._task = task
        self.hold = hold
        self.interrupted: str | None = None
        self.headers_received = False
        self.client_gone = False
        self.answered = False  # the client got a 504 while the upstream still works
        self.sender: asyncio.Future[None] | None = None

    def interrupt(self, reason: str) -> None:
        """Stop the exchange for ``reason`` (``client_gone`` or ``deadline``); first wins."""
        if self.interrupted is None:
            self.interrupted = reason
            self._task.cancel()

    def client_left(self) -> None:
        """The client disconnected."""
        self.client_gone = True
        if not self.hold or self.headers_received:
            self.interrupt("client_gone")

    def deadline_passed(self, answer: Callable[[], Awaitable[None]]) -> None:
        """The request's deadline passed before the upstream answered (hold mode):
        answer the client now, keep waiting for the upstream."""
        if self.headers_received or self.answered:
            return
        self.answered = True
        if not self.client_gone:
            self.sender = asyncio.ensure_future(answer())

    def absorb(self) -> None:
        """Swallow our own cancellation (Python 3.11+ counts them)."""
        uncancel = getattr(self._task, "uncancel", None)
        if uncancel is not None:
            uncancel()


class _ClientWatch:
    """Owns ASGI ``receive`` for one request: yields the body, watches for a disconnect.

    The body is read straight from ``receive`` as aiohttp sends it upstream, so a
    slow upstream slows the client's upload (uvicorn pauses reading) and nothing
    is buffered. Watching for a disconnect needs a task awaiting ``receive``; it
    is started only where a disconnect changes what the proxy does: from the end
    of the body when abandoned requests are cut off (``--close-abandoned``), and
    while streaming a response of unknown length (an SSE stream to a client that
    left must stop). Most requests, with a sized answer, never pay for it.
    """

    __slots__ = ("_exchange", "_receive", "body_done", "reader")

    def __init__(self, receive: Receive, exchange: _Exchange, has_body: bool) -> None:
        self._receive = receive
        self._exchange = exchange
        self.body_done = not has_body
        self.reader: asyncio.Future[None] | None = None

    def start(self) -> None:
        """Watch for a disconnect from now on (after the body was read)."""
        if self.reader is None:
            self.reader = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._exchange.client_left()
                return

    async def body(self) -> AsyncIterator[bytes]:
        """The request body, chunk by chunk, as the client sends it."""
        while not self.body_done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.body_done = True
                self._exchange.client_left()
                raise _ClientGone
            self.body_done = not message.get("more_body", False)
            body = message.get("body", b"")
            if body:
                yield bytes(body)
        if not self._exchange.hold:
            self.start()

    def stop(self) -> None:
        """Stop watching (before the last response message: after it uvicorn reports a
        disconnect that is not the client's)."""
        if self.reader is not None:
            self.reader.cancel()


class _ClientGone(Exception):
    """The client disconnected while sending its body."""


def _has_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding":
            return True
        if name == b"content-length":
            return value.strip() not in (b"0", b"")
    return False


class ProxyApp:
    """The forwarding ASGI app; see the module docstring. Use :func:`create_proxy`."""

    def __init__(
        self,
        config: ProxyConfig,
        pool: UpstreamPool,
        metrics: LoadshedMetrics,
    ) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.proxy_metrics = ProxyMetrics(metrics, pool)
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=config.connect_timeout,
            sock_read=config.read_timeout,
        )  # fmt: skip
        self._connections_per_upstream = make_limit(config.limit).max_limit
        self._urls: dict[tuple[str, bytes, bytes], URL] = {}
        self._exhaustion_logged = -math.inf

    # ----------------------------------------------------------- lifecycle

    def session(self) -> aiohttp.ClientSession:
        """The shared upstream session (created on first use, in the running loop)."""
        if self._session is None or self._session.closed:
            per_upstream = self._connections_per_upstream
            connector = aiohttp.TCPConnector(
                limit=per_upstream * len(self.pool.upstreams),
                limit_per_host=per_upstream,
                keepalive_timeout=30.0,
                ttl_dns_cache=60,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # never carry one client's cookies to another
                skip_auto_headers=_SKIP_AUTO_HEADERS,
                trust_env=False,  # never route through an environment proxy
            )
        return self._session

    async def aclose(self) -> None:
        """Close upstream connections and stop health probes."""
        await self.pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -------------------------------------------------------------- serving

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":  # websockets are not proxied
            return
        upstream: Upstream | None = scope.get(_UPSTREAM_KEY)  # set only for a safe target
        if upstream is None and not is_origin_form(scope):
            await _send_error(send, 400, error_body("bad_request", _NOT_ORIGIN_FORM))
            return
        path = scope.get(_PATH_KEY)
        if path is None:
            path = safe_path(scope["raw_path"])
            if path is None:
                await _send_error(send, 400, error_body("bad_request", _UNSAFE_PATH))
                return
            scope[_PATH_KEY] = path
        if upstream is None:
            await _send_error(
                send,
                503,
                error_body("no_upstream", "every upstream is marked down; retry later"),
                retry_after=self.config.probe_interval,
            )
            return
        token: Token | None = scope.get("loadshed.token")
        await self._forward(scope, receive, send, upstream, token)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _url(self, upstream: Upstream, raw_path: bytes, query: bytes) -> URL:
        """The upstream URL for this target (parsed URLs cached: most APIs have few)."""
        key = (upstream.name, raw_path, query)
        url = self._urls.get(key)
        if url is None:
            target = upstream.url.prefix.encode() + raw_path + (b"?" + query if query else b"")
            url = URL(upstream.url.origin + target.decode("latin-1"), encoded=True)
            if len(self._urls) >= _URL_CACHE_SIZE:
                self._urls.clear()
            self._urls[key] = url
        return url

    def _remaining(self, scope: Scope, token: Token | None, clock: Clock) -> float | None:
        """Seconds left before the request's deadline, or None without one."""
        if token is None:
            return None
        timeout = self.config.deadline
        for name, value in scope.get("headers", ()):
            try:
                if name == b"x-request-timeout":
                    timeout = parse_timeout_seconds(value.decode("latin-1"))
                elif name == b"grpc-timeout":
                    timeout = parse_grpc_timeout(value.decode("latin-1"))
            except HeaderError:
                pass  # the middleware counted it; like it, ignore the value
        if timeout is None:
            return None
        arrived = token.admitted_at - token.queue_wait
        return arrived + timeout - clock.now()

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, upstream: Upstream, token: Token | None
    ) -> None:
        remaining = self._remaining(scope, token, upstream.limiter.clock)
        hard_limit = self.config.upstream_timeout
        soft_limit = remaining if remaining is not None and remaining < hard_limit else None
        if soft_limit is not None and soft_limit <= 0:
            self._fault(upstream, token, UpstreamFault.TIMEOUT)
            detail = "deadline already passed"
            await _send_error(send, 504, fault_body(UpstreamFault.TIMEOUT, detail))
            return
        url = self._url(upstream, scope[_PATH_KEY], scope.get("query_string", b""))
        headers = request_headers(scope, upstream.url.host_header, remaining)
        task = asyncio.current_task()
        assert task is not None
        hold = self.config.hold_abandoned
        exchange = _Exchange(task, hold)
        has_body = _has_body(scope)
        watch = _ClientWatch(receive, exchange, has_body)
        if not hold and not has_body:
            watch.start()  # a disconnect cuts the upstream request off
        loop = asyncio.get_running_loop()
        soft_timer: asyncio.TimerHandle | None = None
        if hold and soft_limit is not None:

            async def answer_timeout() -> None:
                self.proxy_metrics.faults.labels(upstream.name, UpstreamFault.TIMEOUT.value).inc()
                detail = f"no response headers within {soft_limit:.3g}s"
                await _send_error(send, 504, fault_body(UpstreamFault.TIMEOUT, detail))

            soft_timer = loop.call_later(soft_limit, exchange.deadline_passed, answer_timeout)
            wait_limit = hard_limit
        else:
            wait_limit = soft_limit if soft_limit is not None else hard_limit
        # aiohttp's read timeout (armed when the request is sent) bounds the wait for
        # headers too: when it is the shorter one, spare a timer per request.
        hard_timer: asyncio.TimerHandle | None = None
        if wait_limit < self.config.read_timeout:
            hard_timer = loop.call_later(wait_limit, exchange.interrupt, "deadline")
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                response = await self.session().request(
                    scope["method"],
                    url,
                    headers=headers,
                    data=watch.body() if has_body else None,
                    allow_redirects=False,
                )
            except (aiohttp.ClientError, OSError, TimeoutError, _ClientGone) as error:
                if exchange.client_gone and not exchange.answered:
                    if token is not None:  # the client left mid-upload: not the upstream's fault
                        token.ignored()
                    return
                fault = classify(error)
                self._fault(upstream, token, fault)
                if not (exchange.answered or exchange.client_gone):
                    watch.stop()
                    retry_after = 1.0 if fault is UpstreamFault.PROXY_RESOURCES else None
                    await _send_error(send, fault.status, fault_body(fault), retry_after)
                return
            # The deadline bounds the wait for headers, not a stream's length.
            exchange.headers_received = True
            if hard_timer is not None:
                hard_timer.cancel()
            if soft_timer is not None:
                soft_timer.cancel()
            self.pool.answered(upstream)
            status = response.status
            self.proxy_metrics.count_response(upstream.name, status)
            if exchange.answered or exchange.client_gone:
                # Abandoned while the upstream worked: its slot is free only now. A
                # client that gave up is a missed deadline, as a 504 is: dropped.
                if token is not None:
                    token.release(Outcome.DROPPED)
                return
            if token is not None and status in REFUSAL_STATUSES:
                token.dropped()  # the upstream shed load: a capacity signal
            await self._stream_response(response, send, watch, upstream, token)
        except asyncio.CancelledError:
            if exchange.interrupted is None:
                raise
            exchange.absorb()
            watch.stop()
            if exchange.interrupted == "deadline" and response is None:
                if exchange.answered:  # 504 sent and counted at the deadline already
                    if token is not None:
                        token.dropped()
                else:
                    self._fault(upstream, token, UpstreamFault.TIMEOUT)
                if not (exchange.answered or exchange.client_gone):
                    detail = f"no response headers within {wait_limit:.3g}s"
                    await _send_error(send, 504, fault_body(UpstreamFault.TIMEOUT, detail))
            elif token is not None:
                token.ignored()  # the client left: says nothing about the upstream
        finally:
            if hard_timer is not None:
                hard_timer.cancel()
            if soft_timer is not None:
                soft_timer.cancel()
            watch.stop()
            if response is not None:
                if response.content.at_eof():
                    response.release()  # back to the keep-alive pool
                else:
                    response.close()  # cut short: the connection cannot be reused
            if exchange.sender is not None:
                await exchange.sender  # the 504 must be complete before the app returns

    async def _stream_response(
        self,
        response: aiohttp.ClientResponse,
        send: Send,
        watch: _ClientWatch,
        upstream: Upstream,
        token: Token | None,
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": response_headers(response.raw_headers),
            }
        )
        content = response.content
        if response.content_length is None and not content.at_eof():
            watch.start()  # a stream of unknown length: stop it if the client leaves
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                # Headers are gone already: all that is left is to cut the response short.
                fault = classify(error)
                self._fault(upstream, token, fault)
                logger.warning("upstream %s failed mid-response: %s", upstream.name, fault)
                return
            last = not chunk or content.at_eof()
            if last:
                watch.stop()
                # The upstream is done with this request: its connection goes back to
                # the pool and its slot to the next queued request now, not after the
                # client has taken the last chunk (the outcome still comes at release).
                response.release()
                if token is not None:
                    token.vacate()
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            if last:
                return

    def _fault(self, upstream: Upstream, token: Token | None, fault: UpstreamFault) -> None:
        self.proxy_metrics.faults.labels(upstream.name, fault.value).inc()
        if fault is UpstreamFault.PROXY_RESOURCES:
            # The proxy's own shortage says nothing about the upstream: not a failed
            # connection (never marks it down), not a sample for its limit.
            now = upstream.limiter.clock.now()
            if now - self._exhaustion_logged >= 1.0:  # once a second at most: it comes in floods
                self._exhaustion_logged = now
                logger.warning("no descriptors or buffers for a connection to %s", upstream.name)
            if token is not None:
                token.ignored()
            return
        if fault.connection_failure:
            self.pool.connection_failed(upstream)
        if token is not None:
            token.dropped()


_NOT_ORIGIN_FORM = (
    "request target must be a path (origin-form, /path?query); "
    "absolute URLs, CONNECT and * are refused: this is not a forward proxy"
)
_UNSAFE_PATH = (
    "request path climbs above / with '..' (or hides a dot segment behind an encoded "
    "slash or a backslash): refused, it would leave the upstream's path prefix"
)


async def _send_error(
    send: Send, status: int, body: bytes, retry_after: float | None = None
) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def create_proxy(
    config: ProxyConfig, *, metrics: LoadshedMetrics | None = None
) -> tuple[LoadShedMiddleware, ProxyApp]:
    """Build the proxy: the admission middleware (the ASGI app to serve) and the
    forwarding app inside it (for its pool, metrics and ``aclose``)."""
    metrics = metrics if metrics is not None else LoadshedMetrics()
    upstreams = [
        Upstream(
            url,
            Limiter(config.limit, name=str(url), config=config.admission),
        )
        for url in config.upstreams
    ]
    pool = UpstreamPool(
        upstreams,
        fail_threshold=config.fail_threshold,
        probe_interval=config.probe_interval,
        connect_timeout=config.connect_timeout,
    )
    proxy = ProxyApp(config, pool, metrics)

    def select(scope: Scope) -> Limiter | None:
        if not is_origin_form(scope):
            return None  # refused by the app before it costs any capacity
        path = safe_path(scope["raw_path"])
        if path is None:
            return None  # refused (400) by the app, as above
        scope[_PATH_KEY] = path
        upstream = pool.choose()
        if upstream is None:
            return None
        scope[_UPSTREAM_KEY] = upstream
        return upstream.limiter

    middleware = LoadShedMiddleware(
        proxy,
        limiter=upstreams[0].limiter,
        select=select,
        exclude=(),  # every path belongs to the upstream
        reject_status=config.reject_status,
        max_body_bytes=config.max_body_bytes,
        default_timeout=config.deadline,
        cost_header=config.cost_header,
        metrics=metrics,
        refusal_pacing=config.refusal_pacing,
    )
    metrics.track_all(u.limiter for u in upstreams)
    for upstream in upstreams:  # chosen by select: the middleware's shutdown closes them too
        middleware.close_on_shutdown(upstream.limiter)
    return middleware, proxy
