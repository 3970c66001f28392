"""Run an ASGI app under a real uvicorn server on 127.0.0.1, for tests and benchmarks.

with serve(app) as base_url:
    ...  # real HTTP to base_url, e.g. "http://127.0.0.1:54321"
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

__all__ = ["serve"]


@contextmanager
def serve(app: Any, *, host: str = "127.0.0.1", startup_timeout: float = 10.0) -> Iterator[str]:
    """Serve ``app`` on an ephemeral port in a background thread; yield its base URL."""
    config = uvicorn.Config(
        app, host=host, port=0, log_level="warning", lifespan="off", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="loadshed-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on {host} within {startup_timeout}s")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
