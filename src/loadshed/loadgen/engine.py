"""The send loops of one generator process: closed loop (C clients, each waiting for its
response) and open loop (requests on a timeline, latency measured from the intended send time).

Every request ends as exactly one of: an HTTP status, ``timeout`` (abandoned at the client
timeout, its connection closed, latency = lag + timeout), ``connect``, ``reset`` or ``other``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from yarl import URL

from loadshed.clock import MONOTONIC, Clock
from loadshed.loadgen.options import REJECTED_STATUSES, RETRY_AFTER, BenchOptions
from loadshed.loadgen.results import RunResult
from loadshed.loadgen.schedule import arrival_offsets
from loadshed.retry import parse_retry_after

__all__ = ["Engine", "LiveCounters", "run_engine"]

SendFunction = Callable[[], Awaitable[int]]
"""Sends the run's request once and returns the response status."""

_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})
_PROGRESS_INTERVAL_S = 0.25
_EARLY_S = 0.0005  # send a request this early rather than sleep less than a timer tick
_YIELD_EVERY = 64  # while catching up, let responses in at least this often


@dataclasses.dataclass
class LiveCounters:
    """Counters for the live progress line (whole run, warm-up included)."""

    sent: int = 0
    done: int = 0
    ok: int = 0
    failed: int = 0
    inflight: int = 0
    not_sent: int = 0
    max_lag_s: float = 0.0
    elapsed_s: float = 0.0
    total_s: float = 0.0

    def snapshot(self) -> dict[str, float]:
        """A picklable copy for another process."""
        return {k: float(v) for k, v in dataclasses.asdict(self).items()}


def _error_kind(exc: BaseException) -> str:
    """Classify a client failure as ``connect``, ``reset`` or ``other``."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect"
    if type(exc).__name__ == "ConnectFailed":  # rawhttp's, imported only when used
        return "connect"
    if isinstance(
        exc,
        (
            aiohttp.ServerDisconnectedError,
            aiohttp.ClientPayloadError,
            ConnectionResetError,
            BrokenPipeError,
        ),
    ):
        return "reset"
    if isinstance(exc, OSError) and exc.errno in _RESET_ERRNOS:
        return "reset"
    return "other"


class Engine:
    """Drives one share of the load from one process, on the running event loop."""

    def __init__(
        self,
        options: BenchOptions,
        *,
        clock: Clock = MONOTONIC,
        phase: float = 0.0,
        live: LiveCounters | None = None,
    ) -> None:
        self.options = options
        self.clock = clock
        self.phase = phase
        self.live = live or LiveCounters()
        self.result = RunResult(
            mode=options.mode,
            url=options.url,
            duration_s=options.duration_s,
            clients=options.clients,
            rate=options.rate,
            arrival=options.arrival if options.mode == "open" else None,
            warmup_s=options.warmup_s,
            timeout_s=options.timeout_s,
            client=options.client,
            honor_retry_after=options.honor_retry_after,
            retry_jitter=options.retry_jitter,
        )
        self._url = URL(options.url, encoded=False)
        self._headers = options.request_headers
        self._window_start = 0.0
        self._window_end = 0.0

    async def run(self, start_at: float | None = None) -> RunResult:
        """Run warm-up and the measured window (starting at ``start_at`` on the clock, or now)."""
        options = self.options
        send, close = self._make_client()
        try:
            if start_at is not None:
                await asyncio.sleep(max(0.0, start_at - self.clock.now()))
            started = self.clock.now()
            self._window_start = started + options.warmup_s
            self._window_end = self._window_start + options.duration_s
            self.live.total_s = options.warmup_s + options.duration_s
            cpu = _WindowCpu()
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + (self._window_start - self.clock.now()), cpu.mark_start)
            if options.mode == "closed":
                await self._closed_loop(send)
            else:
                await self._open_loop(send)
            self.result.generator_cpu_s = cpu.stop()
        finally:
            await close()
        return self.result

    def _make_client(self) -> tuple[SendFunction, Callable[[], Awaitable[None]]]:
        """The coroutine that sends one request and returns its status, and a closer."""
        options = self.options
        if options.client == "raw":
            from loadshed.loadgen.rawhttp import RawHttpClient

            raw = RawHttpClient(options.url, options.method, self._headers, options.body)
            return raw.send, raw.close
        connector = aiohttp.TCPConnector(
            limit=options.clients or 0, ttl_dns_cache=300, enable_cleanup_closed=False
        )
        session = aiohttp.ClientSession(
            connector=connector,
            # The engine enforces its own timeout (one timer per request, exact to the ms).
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
        )
        # aiohttp silently resends an idempotent request once when a reused connection fails;
        # a load generator must count that failure instead (wrk and vegeta do not retry).
        # There is no public switch, so set the flag its retry logic reads, when present.
        if hasattr(session, "_retry_connection"):
            session._retry_connection = False
        url, method, headers, body = self._url, options.method, self._headers, options.body

        async def send() -> int:
            response = await session.request(method, url, headers=headers, data=body)
            try:
                await response.read()
            except BaseException:
                response.close()  # a timeout mid-body: drop the connection
                raise
            response.release()
            if response.status in REJECTED_STATUSES:
                RETRY_AFTER.set(parse_retry_after(response.headers.get("Retry-After")))
            return response.status

        return send, session.close

    # -- one request --------------------------------------------------------------------------

    async def _request(self, send: SendFunction, origin: float, scheduled: float = 0.0) -> None:
        """Send one request; record its outcome if it belongs to the measured window.

        ``origin`` is where latency starts: the intended send time (open loop) or the actual
        send time (closed loop). ``scheduled`` places an open-loop request in or out of the
        measured window.
        """
        options = self.options
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        sent_at = self.clock.now()
        timer = loop.call_at(loop.time() + options.timeout_s, expire)
        live = self.live
        live.sent += 1
        live.inflight += 1
        status = 0
        kind = ""
        try:
            status = await send()
        except asyncio.CancelledError:
            if not expired:
                raise
            # Our own timeout: the client has dropped the connection, as a real client would.
            uncancel = getattr(task, "uncancel", None)
            if uncancel is not None:
                uncancel()
            kind = "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            kind = _error_kind(exc)
        finally:
            timer.cancel()
            live.inflight -= 1
        done_at = self.clock.now()
        live.done += 1
        if kind:
            live.failed += 1
        elif 200 <= status < 300:
            live.ok += 1
        else:
            live.failed += 1
        in_window = self._window_start <= done_at <= self._window_end
        if in_window and not kind:
            self.result.record_completion(status)
        if options.mode == "closed":
            # Closed loop counts what completes inside the window (as wrk does).
            if not in_window:
                return
        elif scheduled < self._window_start:
            # Open loop counts what was scheduled inside the window, however late it ends.
            return
        if kind == "timeout":
            self.result.record_error(kind, (sent_at - origin) + options.timeout_s)
        elif kind:
            self.result.record_error(kind, done_at - origin)
        else:
            self.result.record_response(status, done_at - origin)

    # -- closed loop --------------------------------------------------------------------------

    async def _closed_loop(self, send: SendFunction) -> None:
        clients = self.options.clients or 1
        workers = [asyncio.ensure_future(self._client(send, index)) for index in range(clients)]
        progress = asyncio.ensure_future(self._tick())
        try:
            await asyncio.sleep(max(0.0, self._window_end - self.clock.now()))
        finally:
            # Requests still in flight at the end are abandoned and not counted (as in wrk).
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            progress.cancel()
            self._tick_once()

    async def _client(self, send: SendFunction, index: int) -> None:
        end = self._window_end
        now = self.clock.now
        honor_retry_after = self.options.honor_retry_after
        jitter = self.options.retry_jitter
        # One stream per client (clients sharing one would jitter alike); seeded runs repeat.
        seed = self.options.seed
        rng = random.Random(None if seed is None else f"{seed}/{self.phase}/{index}")
        while now() < end:
            start = now()
            if not honor_retry_after:
                await self._request(send, start)
                continue
            RETRY_AFTER.set(None)
            await self._request(send, start)
            wait = RETRY_AFTER.get()
            if wait:
                if jitter:
                    wait *= rng.uniform(1.0 - jitter, 1.0 + jitter)
                remaining = end - now()
                if wait >= remaining:
                    # Told to come back after the window: this client is done. (Sleeping
                    # to the end and looping sent one more request when the timer woke
                    # a hair early, within the loop's clock resolution.)
                    await asyncio.sleep(max(0.0, remaining))
                    break
                await asyncio.sleep(wait)

    # -- open loop ----------------------------------------------------------------------------

    async def _open_loop(self, send: SendFunction) -> None:
        options = self.options
        assert options.rate is not None
        rng = random.Random(options.seed)
        start = self._window_start - options.warmup_s
        total = options.warmup_s + options.duration_s
        max_inflight = options.max_inflight
        lag_hist = self.result.histograms["send_lag"]
        live = self.live
        pending: set[asyncio.Task[None]] = set()
        progress = asyncio.ensure_future(self._tick())
        now = self.clock.now
        burst = 0
        try:
            for offset in arrival_offsets(options.rate, options.arrival, total, rng, self.phase):
                intended = start + offset
                delay = intended - now()
                if delay > _EARLY_S:
                    burst = 0
                    await asyncio.sleep(delay)
                else:
                    burst += 1
                    if burst % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)
                sent = now()
                lag = sent - intended
                # Timers tick in milliseconds (uvloop's can fire up to ~1 ms early), so requests
                # due within _EARLY_S go now. An early request's latency starts when it is sent,
                # a late one's when it should have been sent.
                origin = intended
                if lag < 0:
                    lag, origin = 0.0, sent
                in_window = intended >= self._window_start
                if lag > live.max_lag_s:
                    live.max_lag_s = lag
                if in_window:
                    self.result.scheduled += 1
                    lag_hist.record(lag)
                if max_inflight is not None and live.inflight >= max_inflight:
                    live.not_sent += 1
                    if in_window:
                        self.result.not_sent += 1
                    continue
                task = asyncio.ensure_future(self._request(send, origin, intended))
                pending.add(task)
                task.add_done_callback(pending.discard)
            # Every scheduled request gets an outcome: wait for the tail (bounded by timeouts).
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            for task in pending:
                task.cancel()
            progress.cancel()
            self._tick_once()

    # -- progress -----------------------------------------------------------------------------

    def _tick_once(self) -> None:
        self.live.elapsed_s = min(
            self.live.total_s, self.clock.now() - (self._window_start - self.options.warmup_s)
        )

    async def _tick(self) -> None:
        while True:
            self._tick_once()
            await asyncio.sleep(_PROGRESS_INTERVAL_S)


class _WindowCpu:
    """CPU time this process spends from the start of the window to :meth:`stop`."""

    def __init__(self) -> None:
        self._started: float | None = None

    def mark_start(self) -> None:
        self._started = time.process_time()

    def stop(self) -> float:
        if self._started is None:
            return 0.0
        return time.process_time() - self._started


def _run_coroutine(factory: Callable[[], Any]) -> Any:
    """Run a coroutine on uvloop when it is installed, else on the default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(factory())
    return uvloop.run(factory())


def run_engine(
    options: BenchOptions,
    *,
    start_at: float | None = None,
    phase: float = 0.0,
    live: LiveCounters | None = None,
    on_progress: Callable[[LiveCounters], None] | None = None,
) -> RunResult:
    """Run one share of the load to completion on a fresh (uv)loop in this thread."""
    engine = Engine(options, phase=phase, live=live)
    callback = on_progress

    async def main() -> RunResult:
        if callback is None:
            return await engine.run(start_at)
        reporter = asyncio.ensure_future(_report(engine.live, callback))
        try:
            return await engine.run(start_at)
        finally:
            reporter.cancel()
            callback(engine.live)

    result: RunResult = _run_coroutine(main)
    return result


async def _report(live: LiveCounters, on_progress: Callable[[LiveCounters], None]) -> None:
    while True:
        await asyncio.sleep(_PROGRESS_INTERVAL_S)
        on_progress(live)
