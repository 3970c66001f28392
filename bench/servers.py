"""What the middleware benchmarks share: loopback ports and uvicorn serving an app from
``bench/middleware_targets.py``."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    """A port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def uvicorn_command(app: str, port: int) -> list[str]:
    """uvicorn serving ``middleware_targets:<app>`` on 127.0.0.1:port, as quiet as it gets
    (uvloop and httptools, as ``loadshed serve-demo`` runs)."""
    return [
        sys.executable, "-m", "uvicorn", f"middleware_targets:{app}", "--app-dir", str(HERE),
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
        "--no-access-log", "--lifespan", "off",
    ]  # fmt: skip


def wait_for_port(port: int, timeout_s: float, what: str) -> None:
    """Return once 127.0.0.1:port accepts connections; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start")
