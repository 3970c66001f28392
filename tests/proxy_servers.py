"""Real servers for the proxy's tests: the proxy under the CLI's uvicorn settings,
small upstream apps, and an upstream in a child process that a test can kill.
Everything listens on 127.0.0.1 with an ephemeral port."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from loadshed.proxy import ProxyApp, ProxyConfig, create_proxy, parse_upstream
from loadshed.proxy.cli import server_config
from loadshed.proxy.security import client_connections
from loadshed.testing import base_url, serve, serve_config


@contextmanager
def run_proxy(*upstreams: str, **settings: Any) -> Iterator[tuple[str, ProxyApp]]:
    """The proxy in front of ``upstreams``, served exactly as ``loadshed proxy`` serves it."""
    config = ProxyConfig(
        upstreams=tuple(parse_upstream(u) for u in upstreams), host="127.0.0.1", port=0, **settings
    )
    app, proxy = create_proxy(config)
    served = server_config(app, config)
    proxy.proxy_metrics.connections = client_connections(served.http)
    with serve_config(served) as server:
        yield base_url(server), proxy


def serve_asgi(app: Any) -> AbstractContextManager[str]:
    """An upstream ASGI app under plain uvicorn (httptools), lifespan off."""
    return serve(app)


@dataclass
class Recorder:
    """What an upstream saw."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    disconnected: threading.Event = field(default_factory=threading.Event)


def echo_app(
    recorder: Recorder, status: int = 200, extra: list[tuple[bytes, bytes]] | None = None
) -> Any:
    """Answers with the request it got as JSON (method, path, headers, body)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
            "body": body.decode("latin-1"),
        }
        recorder.requests.append(seen)
        payload = json.dumps(seen).encode()
        headers = [(b"content-type", b"application/json"), *(extra or [])]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    return app


def gated_stream_app(gate: threading.Event, first_sent: threading.Event) -> Any:
    """Sends ``first\\n``, waits for ``gate``, then sends ``last\\n`` (chunked)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
        first_sent.set()
        await asyncio.to_thread(gate.wait, 10)
        await send({"type": "http.response.body", "body": b"data: last\n\n", "more_body": False})

    return app


def slow_app(seconds: float, recorder: Recorder) -> Any:
    """Answers 200 after ``seconds``, or stops when the caller hangs up (recorded)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        recorder.requests.append(
            {"headers": [[k.decode(), v.decode()] for k, v in scope["headers"]]}
        )
        await receive()  # the (empty) body

        async def wait_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            recorder.disconnected.set()

        watcher = asyncio.ensure_future(wait_disconnect())
        try:
            await asyncio.wait_for(asyncio.shield(watcher), seconds)
            return  # the caller hung up: stop working, like a server that notices
        except asyncio.TimeoutError:
            watcher.cancel()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"slow"})

    return app


_CHILD = """
import sys, uvicorn
from loadshed.demo.origin import create_app
sock_port = int(sys.argv[1])
uvicorn.run(create_app(workers=int(sys.argv[2]), service_time=float(sys.argv[3])),
            host="127.0.0.1", port=sock_port, log_level="warning", access_log=False)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def origin_process(
    workers: int = 2, service_time: float = 5.0, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The demo origin in a child process (so a test can kill it); yields (url, process)."""
    port = port or free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(port), str(workers), str(service_time)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("origin child process did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def raw_request(url: str, data: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes to the server at ``url`` and return everything it answers
    (until it closes: send ``Connection: close`` or a request it closes on)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)  # no half-close: uvicorn takes EOF for a disconnect
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def endless_stream_app(recorder: Recorder) -> Any:
    """A server-sent-event stream that never ends; records when its caller hangs up."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        start = {"type": "http.response.start", "status": 200}
        await send({**start, "headers": [(b"content-type", b"text/event-stream")]})

        async def wait_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(wait_disconnect())
        index = 0
        while not watcher.done():
            await send(
                {"type": "http.response.body", "body": b"data: %d\n\n" % index, "more_body": True}
            )
            index += 1
            await asyncio.sleep(0.02)
        recorder.disconnected.set()

    return app
