"""The fault probes: real servers on 127.0.0.1, raw sockets, kill -9, SIGTERM.

Each probe returns :class:`Row` objects (``probe | expected | observed | verdict``).
``FAST`` probes take seconds and also run as tests (``tests/test_faults.py``); the soak
and the slowloris at the descriptor limit are in ``SLOW`` and run from
``bench/faults/run.py`` only. Servers and helpers come from the tests
(``tests/proxy_servers.py``, ``tests/proxy/test_proxy_limits.py``) and the live demo
(:func:`loadshed.demo.live.start_server`), so the probes drive exactly what they test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _folder in (ROOT / "tests", ROOT / "tests" / "proxy", ROOT / "bench"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import psutil  # noqa: E402
import requests  # noqa: E402

from loadshed.demo.live import DemoServer, start_server  # noqa: E402
from proxy_servers import Recorder, echo_app, free_port, run_proxy, serve_asgi  # noqa: E402

__all__ = ["FAST", "SLOW", "Row", "render"]

PYTHON = sys.executable
# The servers' own warnings ("Invalid HTTP request received") are what the probes provoke.
logging.getLogger("uvicorn.error").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    probe: str
    expected: str
    observed: str
    holds: bool

    @property
    def verdict(self) -> str:
        """``holds`` or ``breaks``."""
        return "holds" if self.holds else "breaks"


def render(rows: list[Row]) -> str:
    """The markdown table ``probe | expected | observed | verdict``."""
    lines = ["| probe | expected | observed | verdict |", "| --- | --- | --- | --- |"]
    for row in rows:
        cells = (row.probe, row.expected, row.observed, row.verdict)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ raw sockets


def exchange(url: str, data: bytes, *, quiet: float = 0.5, timeout: float = 5.0) -> bytes:
    """Send raw bytes, return what comes back until the server closes, ``quiet``
    seconds of silence, or ``timeout`` in all."""
    host, port = url.removeprefix("http://").split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        sock.settimeout(quiet)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError):  # timeouts and resets end the answer
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
    return answer


def statuses(answer: bytes) -> list[int]:
    """Status codes of every response in a raw answer."""
    found = []
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            found.append(int(line[9:12]))
    return found


@contextlib.contextmanager
def fault_upstream(mode: str) -> Iterator[str]:
    """A TCP upstream that misbehaves: ``hang`` (reads, never answers), ``reset``
    (reads, then RST), ``garbage`` (answers bytes that are not HTTP), ``truncated``
    (a Content-Length it does not keep). Yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.settimeout(2)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            if mode == "hang":
                held.append(conn)
                continue
            with contextlib.suppress(OSError):
                if mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                elif mode == "garbage":
                    conn.sendall(b"\x00\xffNOT HTTP AT ALL\r\n\r\n")
                elif mode == "truncated":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
            conn.close()

    thread = threading.Thread(target=serve, name=f"upstream-{mode}", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()


def _timed_get(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> str:
    started = time.monotonic()
    try:
        response = requests.get(url, headers=headers, timeout=timeout)
        outcome = str(response.status_code)
    except requests.RequestException as error:
        outcome = type(error).__name__
    return f"{outcome} in {time.monotonic() - started:.2f}s"


def _status_in(observed: str, allowed: tuple[int, ...], within: float) -> bool:
    code, _, rest = observed.partition(" in ")
    return code.isdigit() and int(code) in allowed and float(rest.rstrip("s")) <= within


# ------------------------------------------------------------ upstream faults


def upstream_faults() -> list[Row]:
    """Each upstream fault becomes the proxy's 502/504 within the request's deadline,
    and the proxy goes on serving a healthy upstream."""
    rows = []
    deadline = {"X-Request-Timeout": "1"}
    dead_port = free_port()
    with run_proxy(f"http://127.0.0.1:{dead_port}", connect_timeout=0.5) as (proxy, _):
        observed = _timed_get(f"{proxy}/x", deadline)
        rows.append(
            Row("upstream dead (nothing listens)", "502 or 503 within 1 s", observed,
                _status_in(observed, (502, 503), 1.2))
        )  # fmt: skip
    for mode, expected, allowed in (
        ("hang", "504 within the 1 s deadline", (504,)),
        ("reset", "502 within 1 s", (502,)),
        ("garbage", "502 within 1 s", (502,)),
    ):
        # --close-abandoned: the hanging upstream's connection is closed at the deadline,
        # so the server stops at once when the probe ends.
        with (
            fault_upstream(mode) as upstream,
            run_proxy(upstream, hold_abandoned=False) as (
                proxy,
                _,
            ),
        ):
            observed = _timed_get(f"{proxy}/x", deadline)
            rows.append(
                Row(f"upstream {mode}", expected, observed, _status_in(observed, allowed, 1.3))
            )
    with fault_upstream("truncated") as upstream, run_proxy(upstream) as (proxy, _):
        answer = exchange(proxy, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n", quiet=1.0)
        body = answer.partition(b"\r\n\r\n")[2]
        complete = len(body) >= 100
        observed = f"{statuses(answer) or 'nothing'}, body {len(body)} of 100 B, then closed"
        rows.append(
            Row("upstream truncates its body", "never passed off as complete (502 or cut)",
                observed, not complete or statuses(answer) == [502])
        )  # fmt: skip
    recorder = Recorder()
    with serve_asgi(_slow_echo(0.6, recorder)) as upstream, run_proxy(upstream) as (proxy, _):
        late = _timed_get(f"{proxy}/x", {"X-Request-Timeout": "0.3"})
        fine = _timed_get(f"{proxy}/x", {"X-Request-Timeout": "2"})
        rows.append(
            Row("upstream slow (0.6 s): 0.3 s deadline, then 2 s",
                "504 within 0.5 s, then 200", f"{late}; {fine}",
                _status_in(late, (504,), 0.5) and _status_in(fine, (200,), 1.5))
        )  # fmt: skip
    return rows


def _slow_echo(seconds: float, recorder: Recorder) -> Any:
    inner = echo_app(recorder)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await asyncio.sleep(seconds)
        await inner(scope, receive, send)

    return app


# ---------------------------------------------------------------- smuggling

_SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
_SMUGGLING: dict[str, bytes] = {
    "CL + TE": b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE + CL": b"Transfer-Encoding: chunked\r\nContent-Length: 6\r\n\r\n0\r\n\r\n",
    "two Content-Lengths": b"Content-Length: 0\r\nContent-Length: 40\r\n\r\n",
    "Content-Length: +0": b"Content-Length: +0\r\n\r\n",
    "TE xchunked + CL": b"Transfer-Encoding: xchunked\r\nContent-Length: 0\r\n\r\n",
    "TE with space before colon": b"Transfer-Encoding : chunked\r\nContent-Length: 0\r\n\r\n",
    "TE chunked, identity + CL": b"Transfer-Encoding: chunked, identity\r\nContent-Length: 0\r\n\r\n",  # noqa: E501
    "TE tab chunked + CL": b"Transfer-Encoding:\tchunked\r\nContent-Length: 0\r\n\r\n",
    "TE twice": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nContent-Length: 0\r\n\r\n",  # noqa: E501
    "TE folded (obs-fold)": b"Transfer-Encoding:\r\n chunked\r\nContent-Length: 0\r\n\r\n",
    "chunk size 0x0": b"Transfer-Encoding: chunked\r\n\r\n0x0\r\n\r\n",
    "bare LF line ends": b"Content-Length: 0\nTransfer-Encoding: chunked\n\n0\n\n",
}


def smuggling() -> list[Row]:
    """Request smuggling: the smuggled ``GET /smuggled`` never reaches the upstream."""
    rows = []
    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream) as (proxy, _):
        for name, rest in _SMUGGLING.items():
            before = len(recorder.requests)
            head = b"POST /front HTTP/1.1\r\nHost: x\r\n" + rest
            answer = exchange(proxy, head + _SMUGGLED, quiet=0.3)
            seen = [r["path"] for r in recorder.requests[before:]]
            rows.append(
                Row(f"smuggling: {name}", "refused (4xx) or framed once; /smuggled never forwarded",
                    f"{statuses(answer) or 'closed'}, upstream saw {seen or 'nothing'}",
                    "/smuggled" not in seen)
            )  # fmt: skip
    return rows


# ------------------------------------------------------- request forms, hops


def request_forms() -> list[Row]:
    """Targets a reverse proxy must never forward: absolute form, CONNECT, OPTIONS *,
    paths climbing above the upstream's prefix."""
    rows = []
    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream + "/api") as (proxy, _):
        for name, raw in (
            ("absolute-form GET http://evil.example/", b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"),  # noqa: E501
            ("CONNECT evil.example:443", b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n"),  # noqa: E501
            ("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("path /../secret under prefix /api", b"GET /../secret HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("path /%2e%2e/secret", b"GET /%2e%2e/secret HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("path /..%2fsecret", b"GET /..%2fsecret HTTP/1.1\r\nHost: x\r\n\r\n"),
        ):  # fmt: skip
            before = len(recorder.requests)
            answer = exchange(proxy, raw + b"", quiet=0.3)
            seen = [r["path"] for r in recorder.requests[before:]]
            codes = statuses(answer)
            rows.append(
                Row(name, "4xx, nothing outside /api forwarded",
                    f"{codes or 'closed'}, upstream saw {seen or 'nothing'}",
                    bool(codes) and 400 <= codes[0] < 500
                    and all(path.startswith("/api") for path in seen))
            )  # fmt: skip
    return rows


def hop_by_hop() -> list[Row]:
    """Hop-by-hop and ``Proxy-*`` headers are stripped both ways."""
    recorder = Recorder()
    upstream_hops = [
        (b"connection", b"x-up-hop"),
        (b"x-up-hop", b"secret"),
        (b"keep-alive", b"timeout=99"),
        (b"proxy-authenticate", b"Basic"),
        (b"proxy-custom", b"upstream-secret"),
        (b"upgrade", b"h2c"),
    ]
    client = (
        b"GET /hops HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Client-Hop\r\n"
        b"X-Client-Hop: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
        b"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Custom: client-secret\r\n"
        b"Proxy: http://evil.example\r\nUpgrade: websocket\r\nX-Kept: yes\r\n\r\n"
    )
    with (
        serve_asgi(echo_app(recorder, extra=upstream_hops)) as upstream,
        run_proxy(upstream) as (proxy, _),
    ):
        answer = exchange(proxy, client, quiet=0.3)
    head = answer.partition(b"\r\n\r\n")[0].lower()
    sent = (
        {name.lower() for name, _ in recorder.requests[0]["headers"]}
        if recorder.requests
        else set()
    )
    leaked_up = sorted(
        sent
        & {
            "x-client-hop",
            "keep-alive",
            "te",
            "proxy-authorization",
            "proxy-custom",
            "proxy",
            "upgrade",
        }
    )
    leaked_down = [
        name.decode() for name in (b"x-up-hop:", b"keep-alive: timeout=99", b"proxy-authenticate:",
                                   b"proxy-custom:", b"upgrade:") if name in head
    ]  # fmt: skip
    kept = "x-kept" in sent
    return [
        Row("hop-by-hop + Proxy-* headers, client to upstream", "stripped; X-Kept forwarded",
            f"leaked {leaked_up or 'none'}, X-Kept {'forwarded' if kept else 'lost'}",
            not leaked_up and kept),
        Row("hop-by-hop + Proxy-* headers, upstream to client", "stripped",
            f"{statuses(answer)}, leaked {leaked_down or 'none'}",
            statuses(answer) == [200] and not leaked_down),
    ]  # fmt: skip


# ----------------------------------------------------- oversized and malformed


def bad_input() -> list[Row]:
    """Oversized and malformed requests get a 4xx, are never forwarded, and the
    proxy serves the next request normally."""
    recorder = Recorder()
    big_headers = b"".join(b"X-Big-%d: %s\r\n" % (i, b"a" * 1200) for i in range(60))
    many_headers = b"".join(b"X-N-%d: v\r\n" % i for i in range(101))
    cases: list[tuple[str, bytes, tuple[int, ...]]] = [
        ("request target of 10 KiB", b"GET /" + b"a" * 10240 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (414,)),  # noqa: E501
        ("header block of 72 KiB", b"GET / HTTP/1.1\r\nHost: x\r\n" + big_headers + b"\r\n", (431,)),  # noqa: E501
        ("101 headers", b"GET / HTTP/1.1\r\nHost: x\r\n" + many_headers + b"\r\n", (431,)),
        ("50 MB body declared (head only sent)", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n", (413,)),  # noqa: E501
        ("not HTTP at all", b"HELLO THERE\r\n\r\n", (400,)),
        ("Content-Length: abc", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", (400,)),  # noqa: E501
        ("Content-Length: -1", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", (400,)),
        ("bad chunk size", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", (400,)),  # noqa: E501
        ("header line without a colon", b"GET / HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", (400,)),  # noqa: E501
        ("NUL in a header value", b"GET / HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", (400,)),
        ("HTTP/9.9", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", (400, 505)),
    ]  # fmt: skip
    rows = []
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream) as (proxy, _):
        for name, raw, allowed in cases:
            before = len(recorder.requests)
            started = time.monotonic()
            answer = exchange(proxy, raw, quiet=0.5)
            took = time.monotonic() - started
            codes = statuses(answer)
            forwarded = len(recorder.requests) - before
            rows.append(
                Row(name, f"{'/'.join(map(str, allowed))} at once, not forwarded",
                    f"{codes or 'closed'} in {took:.2f}s, forwarded {forwarded}",
                    bool(codes) and codes[0] in allowed and forwarded == 0 and took < 1.0)
            )  # fmt: skip
        chunked = b"".join(b"100000\r\n" + b"a" * 0x100000 + b"\r\n" for _ in range(9))
        answer = exchange(
            proxy,
            b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
            quiet=1.0,
        )
        rows.append(
            Row("9 MiB chunked body (bound 8 MiB)", "413",
                f"{statuses(answer) or 'closed'}", statuses(answer)[:1] == [413])
        )  # fmt: skip
        observed = _timed_get(f"{proxy}/after", {"X-Request-Timeout": "banana"})
        rows.append(
            Row("malformed X-Request-Timeout, then normal service", "ignored: 200",
                observed, _status_in(observed, (200,), 1.0))
        )  # fmt: skip
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        run_proxy(upstream, header_timeout=0.5) as (
            proxy,
            _,
        ),
    ):
        started = time.monotonic()
        answer = exchange(proxy, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow", quiet=2.0)
        took = time.monotonic() - started
        rows.append(
            Row("request head never completed (--header-timeout 0.5s)", "408, closed after ~0.5 s",
                f"{statuses(answer) or 'closed'} after {took:.2f}s",
                statuses(answer) == [408] and took < 1.5)
        )  # fmt: skip
    return rows


# ------------------------------------------------------------ configuration


_BAD_FLAGS: list[tuple[str, list[str]]] = [
    ("proxy", ["--upstream", "ftp://x"]),
    ("proxy", ["--upstream", "http://127.0.0.1:1", "--limit", "bogus"]),
    ("proxy", ["--upstream", "http://127.0.0.1:1", "--max-queue", "-1"]),
    ("proxy", ["--upstream", "http://127.0.0.1:1", "--grace", "-1s"]),
    ("proxy", ["--upstream", "http://127.0.0.1:1", "--deadline", "nan"]),
    ("proxy", ["--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999"]),
    ("serve-demo", ["--workers", "0"]),
    ("serve-demo", ["--workers", "100000"]),
    ("serve-demo", ["--protect", "bogus"]),
    ("serve-demo", ["--service-time", "-1"]),
    ("serve-demo", ["--grace", "forever"]),
    ("simulate", ["paradox", "--limit-value", "0"]),
    ("plan", ["--workers", "0", "--service-time", "1s", "--timeout", "2s"]),
    ("bench", ["http://127.0.0.1:1/", "--clients", "0"]),
    ("bench", ["http://127.0.0.1:1/", "--rate", "nan"]),
    ("sweep", ["http://127.0.0.1:1/", "--timeout", "-1s"]),
    ("capacity", ["http://127.0.0.1:1/", "--slo", "p99<banana"]),
    ("report", ["/nonexistent/result.json"]),
    ("demo", ["--scale", "-1"]),
]


def bad_configuration() -> list[Row]:
    """Every command refuses bad flags with one line naming the problem, exit 2, and
    starts nothing; Python settings raise ConfigError naming the setting."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOADSHED_MAX_WORKERS": ""}
    env.pop("LOADSHED_MAX_WORKERS")
    processes = [
        (command, args, subprocess.Popen(
            [PYTHON, "-m", "loadshed.cli", command, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True))
        for command, args in _BAD_FLAGS
    ]  # fmt: skip
    rows = []
    for command, args, process in processes:
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, err = process.communicate()
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        message = lines[-1] if lines else ""
        one_line = len(lines) == 1 or (len(lines) <= 3 and lines[0].startswith("Usage:"))
        ok = (
            process.returncode == 2 and one_line and "Traceback" not in err.decode(errors="replace")
        )
        shown = message if len(message) <= 90 else message[:87] + "..."
        rows.append(
            Row(f"loadshed {command} {' '.join(args)}", "exit 2, one line, nothing started",
                f"exit {process.returncode}: {shown}", ok)
        )  # fmt: skip
    rows.append(_python_settings())
    return rows


def _python_settings() -> Row:
    from loadshed import Limiter, LoadShedMiddleware, ModelRunner
    from loadshed.errors import ConfigError

    cases: list[tuple[str, Callable[[], object]]] = [
        ("Limiter(max_queue_wait=nan)", lambda: Limiter(max_queue_wait=math.nan)),
        ("Limiter(max_queue=inf)", lambda: Limiter(max_queue=math.inf)),  # type: ignore[arg-type]
        ("Limiter(max_queue='x')", lambda: Limiter(max_queue="x")),  # type: ignore[arg-type]
        ("LoadShedMiddleware(default_timeout=nan)",
         lambda: LoadShedMiddleware(echo_app(Recorder()), default_timeout=math.nan)),
        ("ModelRunner(workers=100000)", lambda: ModelRunner(abs, workers=100_000)),
    ]  # fmt: skip
    refused = []
    for name, build in cases:
        try:
            build()
        except ConfigError:
            refused.append(name)
    return Row(
        "Python settings: NaN, inf, wrong type, absurd workers",
        f"ConfigError naming the setting ({len(cases)} cases)",
        f"{len(refused)}/{len(cases)} refused",
        len(refused) == len(cases),
    )


# ---------------------------------------------------- workers and shutdown


def _worker_pids(server: DemoServer) -> list[int]:
    return [child.pid for child in psutil.Process(server.pid).children(recursive=True)]


class _Clients:
    """Closed-loop clients in threads; counts statuses and errors."""

    def __init__(self, url: str, count: int, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.outcomes: Counter[str] = Counter()
        self.slowest = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def __enter__(self) -> _Clients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout + 5)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    response = session.get(self.url, timeout=self.timeout)
                    outcome = str(response.status_code)
                    if response.status_code == 503:
                        time.sleep(0.05)  # a refused client backs off a little
                except requests.RequestException as error:
                    outcome = type(error).__name__
                with self._lock:
                    self.outcomes[outcome] += 1
                    self.slowest = max(self.slowest, time.monotonic() - started)


def crash_storm() -> list[Row]:
    """kill -9 every ModelRunner worker of a busy serve-demo (4 workers, 0.2 s), 0.1 s
    apart: only the killed jobs fail (500), every request is answered, the workers are
    replaced and service is normal right after."""
    server = start_server("little", 0.2, workers=4)
    try:
        time.sleep(0.3)
        before = _worker_pids(server)
        with _Clients(f"{server.url}/calculate?input=storm", 8, timeout=5.0) as clients:
            time.sleep(1.0)
            killed = 0
            for pid in before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                time.sleep(0.1)
            time.sleep(2.0)
        answered = sum(n for k, n in clients.outcomes.items() if k.isdigit())
        errors = {k: n for k, n in clients.outcomes.items() if not k.isdigit()}
        failed = clients.outcomes.get("500", 0)
        after = [_timed_get(f"{server.url}/calculate?input=after", timeout=5) for _ in range(5)]
        live = _worker_pids(server)
        storm = Row(
            f"crash storm: kill -9 {killed} of 4 workers in {0.1 * killed:.1f} s under load",
            "only killed jobs fail (500 <= kills), all answered",
            f"{dict(clients.outcomes)} (slowest {clients.slowest:.2f}s)",
            not errors and failed <= killed and answered > 0,
        )
        recovery = Row(
            "after the storm", "4 new workers, 5/5 requests 200",
            f"{len(live)} workers ({len(set(live) & set(before))} old), "
            f"{sum(a.startswith('200') for a in after)}/5 200",
            len(live) == 4 and not set(live) & set(before)
            and all(_status_in(a, (200,), 2.0) for a in after),
        )  # fmt: skip
        return [storm, recovery]
    finally:
        server.stop()


def graceful_shutdown() -> list[Row]:
    """SIGTERM to a busy serve-demo: running requests finish, queued ones get 503 at
    once, exit 0 within --grace, no process left."""
    command = [
        PYTHON, "-m", "loadshed.cli", "serve-demo", "--model", "hashburn", "--protect", "queue",
        "--workers", "2", "--service-time", "0.3", "--grace", "5s", "--port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        url = "http://" + line.split("http://", 1)[1].split()[0]
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"{url}/health", timeout=1)
                break
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        results: dict[int, str] = {}

        def get(index: int) -> None:
            try:
                response = requests.get(f"{url}/calculate?input={index}", timeout=10)
                results[index] = f"{response.status_code}"
            except requests.RequestException as error:
                results[index] = type(error).__name__

        threads = [threading.Thread(target=get, args=(i,), daemon=True) for i in range(4)]
        for thread in threads:
            thread.start()
            time.sleep(0.02)
        time.sleep(0.05)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=10)
        took = time.monotonic() - signalled
        for thread in threads:
            thread.join(timeout=10)
        left = _group_alive(process.pid, within=2.5)
        got = [results.get(i, "none") for i in range(4)]
        return [
            Row("SIGTERM to serve-demo: 2 running, 2 queued (--grace 5s)",
                "200 200 503 503, exit 0 within 5 s, no process left",
                f"{' '.join(got)}, exit {code} after {took:.2f}s, "
                f"{'processes left' if left else 'none left'}",
                got == ["200", "200", "503", "503"] and code == 0 and took < 5 and not left)
        ]  # fmt: skip
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _group_alive(pgid: int, within: float) -> bool:
    """Whether a process of this group (session) is still alive ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


FAST: dict[str, Callable[[], list[Row]]] = {
    "upstream_faults": upstream_faults,
    "smuggling": smuggling,
    "request_forms": request_forms,
    "hop_by_hop": hop_by_hop,
    "bad_input": bad_input,
    "bad_configuration": bad_configuration,
    "crash_storm": crash_storm,
    "graceful_shutdown": graceful_shutdown,
}
"""Probes of a few seconds each: they also run as tests (tests/test_faults.py)."""

SLOW: dict[str, str] = {
    "soak": "bench/faults/soak.py",
    "slowloris": "bench/faults/slowloris.py",
}
"""Long probes: their own scripts, run by bench/faults/run.py."""
