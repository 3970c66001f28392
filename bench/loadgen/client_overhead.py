"""Where does a Python generator's extra latency come from? Same target (answers after 10 ms),
closed loop, 8 connections, 3 s each, interleaved: wrk (C), a bare asyncio-streams HTTP/1.1
loop on uvloop (the floor for Python), a bare aiohttp loop on uvloop (what loadshed uses), and
``loadshed bench -c 8`` with each of its clients (aiohttp, and the lean ``raw`` one). The
difference between the bare loops is the HTTP client's cost.

    .venv/bin/python bench/loadgen/client_overhead.py [--repeat 3] [--service 10ms]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Measured, environment, ms, run_loadshed, run_wrk, table, target

PORT = 18094
CONNECTIONS = 8
DURATION = 3.0


def _measured(tool: str, latencies: list[float]) -> Measured:
    latencies.sort()
    n = len(latencies)
    return Measured(tool, n / DURATION, latencies[n // 2], latencies[int(n * 0.99)])


def bare_streams(url: str) -> Measured:
    """Keep-alive GETs written and parsed by hand on asyncio streams."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    request = f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()
    latencies: list[float] = []

    async def client(end: float) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        while time.monotonic() < end:
            start = time.monotonic()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            latencies.append(time.monotonic() - start)
        writer.close()

    async def main() -> None:
        end = time.monotonic() + DURATION
        await asyncio.gather(*(client(end) for _ in range(CONNECTIONS)))

    uvloop.run(main())
    return _measured("bare asyncio streams (uvloop)", latencies)


def bare_aiohttp(url: str) -> Measured:
    """The same loop through aiohttp's ClientSession."""
    latencies: list[float] = []

    async def client(session: aiohttp.ClientSession, end: float) -> None:
        while time.monotonic() < end:
            start = time.monotonic()
            async with session.get(url) as response:
                await response.read()
            latencies.append(time.monotonic() - start)

    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector) as session:
            end = time.monotonic() + DURATION
            await asyncio.gather(*(client(session, end) for _ in range(CONNECTIONS)))

    uvloop.run(main())
    return _measured("bare aiohttp (uvloop)", latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--service", default="10ms")
    options = parser.parse_args()
    runs: dict[str, list[Measured]] = {}
    with target("sleep", PORT, "-sleep", options.service) as url:
        args = ["-c", str(CONNECTIONS), "-d", f"{DURATION}s", "-w", "0.5s"]
        for _ in range(options.repeat):
            for result in (
                run_wrk(url, CONNECTIONS, DURATION),
                bare_streams(url),
                bare_aiohttp(url),
                run_loadshed(url, [*args, "--client", "aiohttp"], "loadshed --client aiohttp"),
                run_loadshed(url, args, "loadshed (--client raw)"),
            ):
                runs.setdefault(result.tool, []).append(result)
    rows = []
    for tool, results in runs.items():
        rows.append([
            tool,
            f"{statistics.median(r.throughput_rps for r in results):,.0f}",
            ms(statistics.median(r.p50_s for r in results)),
            ms(statistics.median(r.p99_s for r in results)),
        ])  # fmt: skip
    print(f"<!-- {environment()} -->\n")
    print(f"Closed loop, {CONNECTIONS} connections, target answers after {options.service}, "
          f"{DURATION:g} s per run, median of {options.repeat}\n")  # fmt: skip
    print(table(rows, ["client", "responses/s", "p50 ms", "p99 ms"]))


if __name__ == "__main__":
    main()
