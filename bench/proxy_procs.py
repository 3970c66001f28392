"""Process helpers shared by the proxy benchmarks: start servers as real processes on
loopback (optionally pinned to CPUs with taskset), wait for their ports, stop them by pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

PYTHON = sys.executable

HELLO_APP = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, loop="uvloop", http="httptools", lifespan="off")
"""

ORIGIN_APP = """
import sys, uvicorn
from loadshed.demo.origin import create_app
uvicorn.run(create_app(workers=int(sys.argv[2]), service_time=float(sys.argv[3]),
                       queue=int(sys.argv[4])),
            host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False,
            loop="uvloop", http="httptools", lifespan="off")
"""


def free_port() -> int:
    """An ephemeral port free right now on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pinned(command: Sequence[str], cpus: str | None) -> list[str]:
    """``command`` under ``taskset -c cpus`` when asked and available."""
    if cpus and shutil.which("taskset"):
        return ["taskset", "-c", cpus, *command]
    return list(command)


def wait_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until something accepts on 127.0.0.1:port (or the process died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args!r} exited with {process.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout}s") from None
            time.sleep(0.05)


@contextmanager
def started(
    command: Sequence[str], port: int, cpus: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (a server on ``port``) for the duration of the block; stop it by pid."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(pinned(command, cpus), env=env, stdout=subprocess.DEVNULL)
    try:
        wait_port(port, process)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def proxy_command(upstream: str, port: int, limit: str, *extra: str) -> list[str]:
    """``loadshed proxy`` in front of ``upstream`` on ``port``."""
    return [
        PYTHON, "-m", "loadshed.cli", "proxy", "--upstream", upstream,
        "--listen", f"127.0.0.1:{port}", "--limit", limit, *extra,
    ]  # fmt: skip
