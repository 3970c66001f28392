"""Graceful shutdown under load, with real processes: SIGTERM to ``serve-demo``, to
``loadshed proxy`` and to a plain uvicorn serving ``LoadShedMiddleware`` lets running
requests finish (200), answers queued ones 503 + Retry-After at once, reaps every
worker and (for loadshed's own servers) exits 0 within the grace period."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from typing import Any

import pytest
import requests

from loadshed.demo.live import start_server
from loadshed.errors import Rejected, RejectReason
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from proxy_servers import free_port

pytestmark = pytest.mark.timeout(90)

GRACE = 5.0


def _group_gone(pgid: int, timeout: float = 5.0) -> bool:
    """True once no process of this process group (session) is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _wait_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
            return
        except requests.RequestException:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{process.args!r} did not start") from None
            time.sleep(0.05)


class Load:
    """Concurrent GETs, one thread each; records (status, Retry-After, seconds) or an error."""

    def __init__(self) -> None:
        self.results: dict[int, tuple[Any, ...]] = {}
        self._threads: list[threading.Thread] = []

    def send(self, url: str, count: int, *, spacing: float = 0.02) -> None:
        for _ in range(count):
            index = len(self._threads)
            thread = threading.Thread(target=self._get, args=(index, url), daemon=True)
            self._threads.append(thread)
            thread.start()
            time.sleep(spacing)

    def _get(self, index: int, url: str) -> None:
        started = time.monotonic()
        try:
            response = requests.get(url, timeout=20)
            self.results[index] = (
                response.status_code,
                response.headers.get("Retry-After"),
                response.text,
                time.monotonic(),
            )
        except requests.RequestException as error:
            self.results[index] = ("error", repr(error), "", time.monotonic() - started)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)


def _check_stop(load: Load, running: int, queued: int, signalled_at: float) -> None:
    """The first ``running`` requests got 200, the next ``queued`` 503 (shutdown) with a
    Retry-After, answered within a second of the signal."""
    statuses = [load.results[i][0] for i in range(running + queued)]
    assert statuses == [200] * running + [503] * queued, load.results
    for index in range(running, running + queued):
        _, retry_after, body, answered_at = load.results[index]
        assert '"shutdown"' in body and int(retry_after) >= 1, load.results[index]
        assert answered_at - signalled_at < 1.0, load.results[index]


def test_serve_demo_stops_gracefully_under_load() -> None:
    """hashburn, 2 workers, 0.3 s per request, E1's bounded queue (2 running + 2 queued):
    SIGTERM while busy. The two running finish with 200, the two queued get 503 at once,
    the process exits 0 well within --grace and leaves no worker behind."""
    command = [
        sys.executable, "-m", "loadshed.cli", "serve-demo", "--model", "hashburn",
        "--protect", "queue", "--workers", "2", "--service-time", "0.3",
        "--grace", f"{GRACE}s", "--port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        assert process.stdout is not None
        match = re.search(rb"http://127\.0\.0\.1:(\d+)", process.stdout.readline())
        assert match, process.stderr.read() if process.stderr else b""
        port = int(match.group(1))
        _wait_port(port, process)
        load = Load()
        load.send(f"http://127.0.0.1:{port}/calculate?input=x", 4)
        time.sleep(0.05)
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        load.join()
        assert process.wait(timeout=GRACE + 2) == 0
        assert time.monotonic() - signalled_at < GRACE
        _check_stop(load, running=2, queued=2, signalled_at=signalled_at)
        assert _group_gone(process.pid), "a worker process outlived serve-demo"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def test_proxy_stops_gracefully_under_load() -> None:
    """loadshed proxy (fixed:1, queue wait 30 s) before a bare hashburn (0.3 s): one
    request runs, three wait in the proxy's queue. SIGTERM: the running one completes
    with 200 through the proxy, the queued get 503 + Retry-After at once, exit 0."""
    upstream = start_server("none", 0.3, workers=1)
    port = free_port()
    command = [
        sys.executable, "-m", "loadshed.cli", "proxy", "--upstream", upstream.url,
        "--listen", f"127.0.0.1:{port}", "--limit", "fixed:1", "--max-queue-wait", "30s",
        "--grace", f"{GRACE}s",
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_port(port, process)
        load = Load()
        load.send(f"http://127.0.0.1:{port}/calculate?input=x", 4)
        time.sleep(0.05)
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        load.join()
        assert process.wait(timeout=GRACE + 2) == 0, process.stderr.read() if process.stderr else ""
        assert time.monotonic() - signalled_at < GRACE
        _check_stop(load, running=1, queued=3, signalled_at=signalled_at)
        assert _group_gone(process.pid)
        # The upstream itself was never disturbed: it still serves.
        assert requests.get(f"{upstream.url}/calculate?input=y", timeout=5).status_code == 200
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        upstream.stop()


_PLAIN_UVICORN = """
import asyncio, sys, uvicorn
from loadshed import LoadShedMiddleware

async def slow(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await asyncio.sleep(0.5)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})

app = LoadShedMiddleware(slow, limit="fixed:1", limiter_options={"max_queue_wait": 30.0})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            timeout_graceful_shutdown=5)
"""


def test_the_middleware_under_plain_uvicorn_answers_its_queue_at_sigterm() -> None:
    """``uvicorn.run(LoadShedMiddleware(app))``: uvicorn waits for every request before it
    sends the lifespan shutdown, so the middleware hooks SIGTERM itself: the queued
    requests get 503 at once instead of waiting behind the running one."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", _PLAIN_UVICORN, str(port)],
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _wait_port(port, process)
        load = Load()
        load.send(f"http://127.0.0.1:{port}/work", 3)
        time.sleep(0.05)
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        load.join()
        # uvicorn raises the signal again once stopped: killed by SIGTERM, after a clean stop.
        assert process.wait(timeout=7) in (0, -signal.SIGTERM)
        _check_stop(load, running=1, queued=2, signalled_at=signalled_at)
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def test_limiter_close_refuses_the_queue_and_later_requests_but_not_running_ones() -> None:
    async def scenario() -> None:
        limiter = Limiter(Fixed(1), max_queue_wait=30)
        running = await limiter.acquire()
        waiters = [asyncio.ensure_future(limiter.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        assert limiter.queue_length == 3
        assert limiter.close() == 3
        for waiter in waiters:
            with pytest.raises(Rejected) as info:
                await waiter
            assert info.value.reason is RejectReason.SHUTDOWN and info.value.retry_after > 0
        with pytest.raises(Rejected) as info:
            await limiter.acquire()
        assert info.value.reason is RejectReason.SHUTDOWN
        with pytest.raises(Rejected):
            limiter.try_acquire()
        assert limiter.inflight == 1  # the running request keeps its token...
        running.success()  # ...and releases it as usual
        assert limiter.inflight == 0 and limiter.queue_length == 0
        assert limiter.snapshot().counts["rejected:shutdown"] == 5

    asyncio.run(scenario())
