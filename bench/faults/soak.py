"""Soak at 10x capacity: ``loadshed proxy`` (limit little) in front of a bare
``serve-demo`` hashburn (1 worker process, 0.1 s per request: 10 req/s), offered
100 req/s open loop (evenly spaced) for ``--minutes``, each request with a 2 s
client timeout.

Holds when every request is answered 2xx or 503 before its timeout (no timeout, reset
or connection error), the resident memory summed over every process (proxy,
serve-demo, its worker) is flat within 10 % (the median of the last fifth of the run
against the median of the second fifth, after warm-up), and service is normal right
after (5 requests in a row, 200 within 1 s each).

    .venv/bin/python bench/faults/soak.py --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
import psutil
import requests
from probes import Row, render

from loadshed.demo.live import start_server
from proxy_procs import free_port, proxy_command, started

SERVICE_TIME = 0.1
WORKERS = 1
CAPACITY = WORKERS / SERVICE_TIME
OVERLOAD = 10.0
TIMEOUT = 2.0


def _rss(pids: list[int]) -> int:
    """Resident bytes of these processes and all their descendants."""
    total = 0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for member in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += member.memory_info().rss
    return total


async def _load(url: str, rate: float, seconds: float) -> tuple[Counter[str], float]:
    """Open loop at ``rate`` for ``seconds``: outcome counts and the slowest answer."""
    outcomes: Counter[str] = Counter()
    slowest = 0.0
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def one() -> None:
            nonlocal slowest
            sent = time.monotonic()
            try:
                async with session.get(url) as response:
                    await response.read()
                    outcome = str(response.status)
            except asyncio.TimeoutError:
                outcome = "timeout"
            except aiohttp.ClientError as error:
                outcome = type(error).__name__
            outcomes[outcome] += 1
            slowest = max(slowest, time.monotonic() - sent)

        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - start) < seconds:
            due = int(elapsed * rate) + 1
            while sent < due:
                task = asyncio.ensure_future(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(max(0.0, sent / rate - (time.monotonic() - start)))
        if tasks:
            await asyncio.wait(tasks, timeout=TIMEOUT + 2)
    return outcomes, slowest


def run(minutes: float) -> list[Row]:
    """The soak; its rows for the fault table."""
    seconds = minutes * 60
    rate = CAPACITY * OVERLOAD
    demo = start_server("none", SERVICE_TIME, workers=WORKERS)
    port = free_port()
    try:
        command = proxy_command(demo.url, port, "little")
        with started(command, port) as proxy:
            url = f"http://127.0.0.1:{port}/calculate?input=soak"
            samples: list[tuple[float, int]] = []
            stop = threading.Event()

            def sample() -> None:
                begin = time.monotonic()
                while not stop.is_set():
                    samples.append((time.monotonic() - begin, _rss([proxy.pid, demo.pid])))
                    stop.wait(1.0)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            outcomes, slowest = asyncio.run(_load(url, rate, seconds))
            stop.set()
            sampler.join(timeout=5)
            time.sleep(1.0)
            after = []
            for _ in range(5):
                began = time.monotonic()
                try:
                    status = requests.get(url, timeout=5).status_code
                except requests.RequestException:
                    status = 0
                after.append((status, time.monotonic() - began))
    finally:
        demo.stop()
    total = sum(outcomes.values())
    answered = sum(n for k, n in outcomes.items() if k.isdigit() and (k[0] == "2" or k == "503"))
    values = [rss for _, rss in samples]
    fifth = max(1, len(values) // 5)
    baseline = statistics.median(values[fifth : 2 * fifth]) if len(values) >= 5 else values[0]
    final = statistics.median(values[-fifth:])
    growth = final / baseline - 1
    mib = 1 << 20
    return [
        Row(
            f"soak {minutes:g} min at {OVERLOAD:g}x capacity ({rate:g} req/s, proxy + serve-demo)",
            "every request 2xx or 503 before its 2 s timeout",
            f"{answered}/{total} answered {dict(outcomes)}, slowest {slowest:.2f}s",
            total > 0 and answered == total,
        ),
        Row(
            "soak: RSS over all processes",
            "flat within 10 %",
            f"{baseline / mib:.0f} MiB -> {final / mib:.0f} MiB ({growth:+.1%}), "
            f"max {max(values) / mib:.0f} MiB, {len(values)} samples",
            abs(growth) <= 0.10,
        ),
        Row(
            "soak: service right after",
            "5/5 200 within 1 s",
            ", ".join(f"{status} {took:.2f}s" for status, took in after),
            all(status == 200 and took < 1.0 for status, took in after),
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    options = parser.parse_args()
    rows = run(options.minutes)
    print(render(rows))
    sys.exit(1 if any(not row.holds for row in rows) else 0)
