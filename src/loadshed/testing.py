"""Run an ASGI app under a real uvicorn server on 127.0.0.1, for tests and benchmarks.

with serve(app) as base_url:
    ...  # real HTTP to base_url, e.g. "http://127.0.0.1:54321"

with serve_config(uvicorn.Config(app, port=0, ...)) as server:
    ...  # any uvicorn settings; base_url(server), server.servers[0].get_loop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

__all__ = ["base_url", "serve", "serve_config"]


@contextmanager
def serve_config(
    config: uvicorn.Config, *, startup_timeout: float = 10.0, stop_timeout: float = 10.0
) -> Iterator[uvicorn.Server]:
    """Run a uvicorn server with ``config`` on a background thread; yield it once it
    listens, and stop it (waiting up to ``stop_timeout``) when the block ends."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="loadshed-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on {config.host} within {startup_timeout}s")
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=stop_timeout)


def base_url(server: uvicorn.Server) -> str:
    """``http://host:port`` of a started server (its first listening socket)."""
    port = server.servers[0].sockets[0].getsockname()[1]
    return f"http://{server.config.host}:{port}"


@contextmanager
def serve(app: Any, *, host: str = "127.0.0.1", startup_timeout: float = 10.0) -> Iterator[str]:
    """Serve ``app`` on an ephemeral port in a background thread; yield its base URL."""
    config = uvicorn.Config(
        app, host=host, port=0, log_level="warning", lifespan="off", access_log=False
    )
    with serve_config(config, startup_timeout=startup_timeout) as server:
        yield base_url(server)
