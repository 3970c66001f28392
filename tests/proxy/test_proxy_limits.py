"""What the proxy bounds on the client side, with real servers and raw sockets: the
time to send a request head, the header count and size, open connections, and
running out of file descriptors (a child proxy under a small RLIMIT_NOFILE)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from loadshed.proxy import ProxyApp
from proxy_servers import (
    Recorder,
    echo_app,
    free_port,
    raw_request,
    run_proxy,
    serve_asgi,
    slow_app,
)

pytestmark = pytest.mark.timeout(60)


def _connect(url: str, timeout: float = 5.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def _read_until_closed(sock: socket.socket) -> bytes:
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _closed_counts(proxy: ProxyApp) -> dict[str, float]:
    """``loadshed_proxy_client_connections_closed_total`` by reason, from the registry."""
    counts = {}
    for family in proxy.metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "loadshed_proxy_client_connections_closed_total":
                counts[sample.labels["reason"]] = sample.value
    return counts


def test_a_request_head_not_complete_in_time_gets_408_and_is_closed() -> None:
    recorder = Recorder()
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        run_proxy(upstream, header_timeout=0.5) as (url, proxy),
    ):
        silent = _connect(url)  # connects and never sends a byte
        trickle = _connect(url)  # slowloris: a header byte now and then, never the end
        started = time.monotonic()
        trickle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        with contextlib.suppress(OSError):  # closed under it: that is the point
            for _ in range(20):
                time.sleep(0.1)
                trickle.sendall(b"X-Slow: y\r\n")
        for sock in (silent, trickle):
            with sock:
                answer = _read_until_closed(sock)
                assert answer.startswith(b"HTTP/1.1 408 "), answer
                assert b"connection: close" in answer
        assert 0.4 <= time.monotonic() - started < 2.0
        # A kept-alive connection: each request's head is timed from its first byte,
        # not from the connection's start.
        with _connect(url) as sock:
            for _ in range(2):
                sock.sendall(b"GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
                time.sleep(0.4)
        assert _closed_counts(proxy)["head_timeout"] == 2
    assert [r["path"] for r in recorder.requests] == ["/again", "/again"]


def test_header_count_and_an_endless_header_are_bounded() -> None:
    recorder = Recorder()
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        run_proxy(upstream, max_headers=20) as (url, _),
    ):
        head = b"GET /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        fine = raw_request(url, head + b"".join(b"a%d: b\r\n" % i for i in range(18)) + b"\r\n")
        assert fine.startswith(b"HTTP/1.1 200 ")
        many = raw_request(url, head + b"a: b\r\n" * 19 + b"\r\n")
        assert many.startswith(b"HTTP/1.1 431 "), many
        assert b"more than 20 request headers" in many
        # One header that never ends: refused once the head passes its byte bound,
        # long before the header timeout (httptools would keep buffering it).
        with _connect(url) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            with contextlib.suppress(OSError):
                for _ in range(100):
                    sock.sendall(b"a" * 65536)
            answer = _read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert len(recorder.requests) == 1


def test_at_the_connection_bound_the_oldest_idle_connection_makes_room() -> None:
    recorder = Recorder()
    with (
        serve_asgi(slow_app(1.0, recorder)) as upstream,
        run_proxy(upstream, max_connections=4, limit="fixed:8") as (url, proxy),
    ):
        idle = [_connect(url) for _ in range(4)]
        time.sleep(0.2)  # accepted
        # A fifth client: the oldest idle connection is closed to make room for it.
        started = time.monotonic()
        response = requests.get(url + "/work", timeout=5)
        assert response.status_code == 200
        assert 0.9 <= time.monotonic() - started < 3.0
        idle[0].settimeout(2)
        assert idle[0].recv(100) == b""  # closed, without an answer: it had asked nothing
        for sock in idle:
            sock.close()
        time.sleep(0.2)  # the proxy saw them close
        # Four connections busy with requests: nothing idle to close, the next is refused.
        busy = []
        for _ in range(4):
            sock = _connect(url)
            sock.sendall(b"GET /busy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            busy.append(sock)
        time.sleep(0.3)  # all four are at the upstream
        started = time.monotonic()
        refused = raw_request(url, b"GET /more HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 503 "), refused
        assert b"retry-after: 1" in refused
        assert time.monotonic() - started < 0.5
        for sock in busy:
            with sock:
                assert _read_until_closed(sock).startswith(b"HTTP/1.1 200 ")
        assert requests.get(url + "/after", timeout=5).status_code == 200
        closed = _closed_counts(proxy)
    # At least the first idle one; one more if a busy connection arrived before the
    # proxy saw the other idle ones close.
    assert closed["evicted"] >= 1
    assert closed["refused"] == 1
    assert closed["head_timeout"] == 0


# ------------------------------------------------- a child proxy with few descriptors


@contextlib.contextmanager
def _child_proxy(upstream: str, nofile: int, *args: str) -> Iterator[tuple[str, str, int]]:
    """``loadshed proxy`` in a child process whose descriptor limit is ``nofile``;
    yields (proxy URL, metrics URL, pid)."""
    port, metrics_port = free_port(), free_port()

    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    command = [
        sys.executable, "-m", "loadshed.cli", "proxy", "--upstream", upstream,
        "--listen", f"127.0.0.1:{port}", "--metrics-port", str(metrics_port), *args,
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        preexec_fn=limit_descriptors,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stderr is not None
        banner = process.stderr.readline()
        assert f"127.0.0.1:{port}" in banner, banner
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=5)
            if process.stderr is not None:
                process.stderr.close()


def _upstream_metrics(metrics_url: str) -> dict[str, float]:
    text = requests.get(metrics_url + "/metrics", timeout=5).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("loadshed_proxy_upstream_") and "_created" not in line:
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_out_of_descriptors_is_the_proxys_503_and_never_marks_the_upstream_down(
    echo_upstream: tuple[str, Recorder],
) -> None:
    upstream, recorder = echo_upstream
    # --max-connections far above what 128 descriptors hold: the proxy runs out.
    args = ("--max-connections", "1000", "--header-timeout", "60s", "--fail-threshold", "1")
    with _child_proxy(upstream, 128, *args) as (url, metrics_url, pid):
        client = _connect(url)  # a connection in before the descriptors run out
        idle: list[socket.socket] = []
        try:
            full_since = None
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if _descriptors(pid) < 127:
                    full_since = None
                    idle.extend(_connect(url) for _ in range(8))
                    time.sleep(0.02)
                elif full_since is None:
                    full_since = time.monotonic()
                elif time.monotonic() - full_since > 0.3:
                    break
                else:
                    time.sleep(0.02)
            assert full_since is not None, "the proxy never ran out of descriptors"
            for _ in range(3):  # one refused connect would mark it down (--fail-threshold 1)
                client.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                head = client.recv(65536)
                if b"\r\n\r\n" in head and not head.endswith(b"}"):
                    head += client.recv(65536)
                assert head.startswith(b"HTTP/1.1 503 "), head
                assert b"retry-after: 1" in head
                body = json.loads(head.partition(b"\r\n\r\n")[2])
                assert body["error"] == "proxy_overloaded"
                assert body["fault"] == "proxy_resources"
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 5
        while _descriptors(pid) > 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _read_until_closed(client).startswith(b"HTTP/1.1 200 ")
        client.close()
        metrics = _upstream_metrics(metrics_url)
    label = f'upstream="{upstream}"'
    assert metrics[f"loadshed_proxy_upstream_up{{{label}}}"] == 1.0
    assert metrics[f'loadshed_proxy_upstream_faults_total{{fault="proxy_resources",{label}}}'] == 3
    assert not any('fault="refused"' in name for name in metrics)
    assert [r["path"] for r in recorder.requests] == ["/after"]


class _Slowloris:
    """``count`` connections that send a request head one header every ``interval``
    seconds and never finish it; a closed one is replaced at once."""

    def __init__(self, url: str, count: int, interval: float) -> None:
        self.url = url
        self.count = count
        self.interval = interval
        self.closed_by_proxy = 0
        self.connect_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> _Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _open(self, selector: selectors.DefaultSelector) -> None:
        try:
            sock = _connect(self.url, timeout=1.0)
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            self.connect_failures += 1
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        next_trickle = time.monotonic()
        try:
            while not self._stop.is_set():
                while len(selector.get_map()) < self.count and not self._stop.is_set():
                    self._open(selector)
                for key, _ in selector.select(timeout=0.05):  # answered (408) or closed
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    selector.unregister(sock)
                    sock.close()
                    self.closed_by_proxy += 1
                if time.monotonic() >= next_trickle:
                    next_trickle = time.monotonic() + self.interval
                    for key in list(selector.get_map().values()):
                        sock = key.fileobj
                        assert isinstance(sock, socket.socket)
                        with contextlib.suppress(OSError):
                            sock.send(b"X-Slow: y\r\n")
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_normal_clients_are_served_under_a_slowloris_at_the_descriptor_limit(
    echo_upstream: tuple[str, Recorder],
) -> None:
    """256 descriptors (the default bound is then 96 connections), 300 slowloris
    connections: every normal request is answered, and the upstream is never blamed."""
    upstream, recorder = echo_upstream
    with _child_proxy(upstream, 256, "--header-timeout", "2s") as (url, metrics_url, pid):
        with _Slowloris(url, count=300, interval=1.0) as attack:
            time.sleep(1.0)  # the attack has filled the proxy
            latencies = []
            for index in range(20):
                started = time.monotonic()
                response = requests.get(f"{url}/normal/{index}", timeout=5)
                latencies.append(time.monotonic() - started)
                assert response.status_code == 200, response.text
                time.sleep(0.15)
            most_descriptors = _descriptors(pid)
        assert attack.closed_by_proxy >= 300  # evicted for room, or 408 at 2 s
        metrics = _upstream_metrics(metrics_url)
    assert max(latencies) < 2.0, latencies
    assert most_descriptors < 256
    label = f'upstream="{upstream}"'
    assert metrics[f"loadshed_proxy_upstream_up{{{label}}}"] == 1.0
    assert not any("faults_total" in name for name in metrics), metrics
    assert len(recorder.requests) == 20
