"""``loadshed serve-demo``: real uvicorn subprocesses on 127.0.0.1, real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import psutil
import pytest

from loadshed.demo.hashburn import hash_chain

pytestmark = pytest.mark.timeout(60)


class Server:
    def __init__(self, process: subprocess.Popen[bytes], url: str, banner: str) -> None:
        self.process = process
        self.url = url
        self.banner = banner


@contextlib.contextmanager
def serve_demo(*args: str) -> Iterator[Server]:
    """Run ``loadshed serve-demo --port 0 ARGS``; yield once it prints its URL; stop it after
    and check that it and every process it started are gone."""
    process = subprocess.Popen(
        [sys.executable, "-m", "loadshed.cli", "serve-demo", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    family: list[psutil.Process] = []
    try:
        ready, _, _ = select.select([process.stdout], [], [], 20.0)
        banner = process.stdout.readline().decode() if ready else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)", banner)
        assert match is not None, f"no URL printed: {banner!r}"
        assert int(match.group(1)) > 0
        server = Server(process, f"http://127.0.0.1:{match.group(1)}", banner)
        yield server
        parent = psutil.Process(process.pid)
        family = [parent, *parent.children(recursive=True)]
    finally:
        process.terminate()  # the server alone: it stops its own workers
        try:
            process.wait(timeout=10)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
            assert process.stdout is not None and process.stderr is not None
            process.stdout.close()
            errors = process.stderr.read().decode()
            process.stderr.close()
    _gone, alive = psutil.wait_procs(family, timeout=5)
    assert not alive, f"left running: {alive}"
    # uvicorn shuts down cleanly on SIGTERM, then re-raises it (exit status -15)
    assert process.returncode in (0, -signal.SIGTERM), errors
    assert "Traceback" not in errors, errors


async def get(
    session: aiohttp.ClientSession, url: str, retries: int = 100
) -> tuple[int, dict[str, str], bytes]:
    """GET, retrying while the server is still starting (connection refused)."""
    for _ in range(retries):
        try:
            async with session.get(url) as response:
                return response.status, dict(response.headers), await response.read()
        except aiohttp.ClientConnectionError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


async def test_hashburn_protected_answers_health_calculate_and_metrics() -> None:
    with serve_demo("--model", "hashburn", "--service-time", "0.05") as server:
        assert "protect: little" in server.banner
        async with aiohttp.ClientSession() as session:
            status, _, body = await get(session, f"{server.url}/health")
            assert status == 200
            assert b'"model":"hashburn"' in body
            status, headers, body = await get(session, f"{server.url}/calculate?input=hello")
            assert status == 200
            answer = json.loads(body)
            assert answer["result"] == hash_chain(b"hello", answer["rounds"])
            assert answer["service_seconds"] >= 0.05
            assert "queue;dur=" in headers["Server-Timing"]  # it went through the middleware
            status, _, body = await get(session, f"{server.url}/metrics")
            assert status == 200
            text = body.decode()
            assert re.search(r'^loadshed_limit\{limiter="default"\} \d', text, re.M)
            assert 'loadshed_requests_total{limiter="default",outcome="success"' in text
            status, _, _ = await get(session, f"{server.url}/calculate")
            assert status == 422  # missing input: the service's own validation


async def test_protect_none_is_the_bare_service() -> None:
    with serve_demo("--model", "hashburn", "--service-time", "0.02", "--protect", "none") as server:
        async with aiohttp.ClientSession() as session:
            status, headers, _ = await get(session, f"{server.url}/calculate?input=x")
            assert status == 200
            assert "Server-Timing" not in headers
            status, _, _ = await get(session, f"{server.url}/metrics")
            assert status == 404


async def test_protect_queue_is_one_running_plus_one_waiting() -> None:
    """E1's bounded queue for one worker: a burst of 4 gets 2 answers and 2 fast 503s."""
    with serve_demo("--model", "hashburn", "--service-time", "0.4", "--protect", "queue") as server:
        async with aiohttp.ClientSession() as session:
            await get(session, f"{server.url}/health")
            url = f"{server.url}/calculate?input=x"

            async def one() -> tuple[int, float]:
                started = asyncio.get_running_loop().time()
                async with session.get(url) as response:
                    await response.read()
                    return response.status, asyncio.get_running_loop().time() - started

            first = asyncio.ensure_future(one())
            await asyncio.sleep(0.1)  # the first is running in the worker now
            rest = await asyncio.gather(*(one() for _ in range(3)))
            outcomes = [await first, *rest]
        statuses = sorted(status for status, _ in outcomes)
        assert statuses == [200, 200, 503, 503]
        assert all(seconds < 0.3 for status, seconds in outcomes if status == 503)


async def test_protect_deadline_sheds_what_cannot_finish_in_time() -> None:
    """Target 0.5 s with 0.2 s of work: a burst of 8 gets at most 3 answers (running plus
    what fits before the target); the rest 503 and no answer takes much past the target."""
    args = ("--service-time", "0.2", "--protect", "deadline", "--deadline-target", "0.5")
    with serve_demo("--model", "hashburn", *args) as server:
        async with aiohttp.ClientSession() as session:
            url = f"{server.url}/calculate?input=x"
            await get(session, url)  # teaches the limiter the service time
            loop = asyncio.get_running_loop()

            async def one() -> tuple[int, float]:
                started = loop.time()
                async with session.get(url) as response:
                    await response.read()
                    return response.status, loop.time() - started

            outcomes = await asyncio.gather(*(one() for _ in range(8)))
            _, _, body = await get(session, f"{server.url}/metrics")
    ok = [seconds for status, seconds in outcomes if status == 200]
    assert 1 <= len(ok) <= 3
    assert sum(1 for status, _ in outcomes if status == 503) == 8 - len(ok)
    assert max(ok) < 0.5 + 0.2  # the target plus one service time of slack for a busy machine
    assert re.search(r'outcome="rejected",reason="deadline"\} [1-9]', body.decode())


async def test_origin_with_workers_and_a_limit_name() -> None:
    args = ("--model", "origin", "--workers", "2", "--service-time", "0.01", "--protect", "aimd")
    with serve_demo(*args) as server:
        assert "/work" in server.banner
        async with aiohttp.ClientSession() as session:
            status, _, _ = await get(session, f"{server.url}/work")
            assert status == 200
            status, _, body = await get(session, f"{server.url}/metrics")
            assert status == 200 and b"loadshed_limit" in body


def _raw(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def test_request_heads_are_bounded_like_the_proxys() -> None:
    """10,000 tiny headers (60 KB, under the byte bound) are refused by their count."""
    with serve_demo("--model", "origin", "--service-time", "0.01", "--protect", "none") as server:
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        ok = _raw(server.url, head + b"".join(b"x-%d: y\r\n" % i for i in range(90)) + b"\r\n")
        assert ok.startswith(b"HTTP/1.1 200 "), ok[:200]
        many = _raw(server.url, head + b"a: b\r\n" * 10_000 + b"\r\n")
        assert many.startswith(b"HTTP/1.1 431 "), many[:200]
        assert b"more than 100 request headers" in many
        long_target = _raw(server.url, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert long_target.startswith(b"HTTP/1.1 414 "), long_target[:200]


@pytest.mark.parametrize(
    ("args", "flag", "allowed"),
    [
        (["--protect", "bogus"], "--protect", "none|queue|deadline|little"),
        (["--protect", "fixed:0"], "--protect", "fixed:N"),
        (["--model", "resnet"], "--model", "hashburn"),
        (["--service-time", "0"], "--service-time", "> 0"),
        (["--model", "digits", "--service-time", "1"], "--service-time", "hashburn and origin"),
        (["--workers", "0"], "--workers", ">= 1"),
        (["--deadline-target", "-1"], "--deadline-target", "> 0"),
        (["--port", "70000"], "--port", "0<=x<=65535"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args: list[str], flag: str, allowed: str) -> None:
    result = run_cli("serve-demo", *args)
    assert result.returncode == 2, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1
    assert flag in error_lines[0] and allowed in error_lines[0]
    assert "Traceback" not in result.stderr


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve-demo", "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"Error: --port: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


@pytest.mark.parametrize(
    ("host", "reason"),
    [("999.1.1.1", "not an address of this machine"), ("192.0.2.1", "Cannot assign")],
)
def test_bad_host_is_one_line_naming_host(host: str, reason: str) -> None:
    result = run_cli("serve-demo", "--host", host, "--port", "0")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: --host: cannot listen on {host}:0: ")
    assert reason in lines[0]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command line in a subprocess, bounded in time (a flag that slipped through
    validation would start a server, not hang the test run)."""
    return subprocess.run(
        [sys.executable, "-m", "loadshed.cli", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
