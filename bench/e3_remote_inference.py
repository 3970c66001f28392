"""E3: remote inference from a bulk caller (docs/design.md, "Reference experiments").

An upstream model with 16 parallel slots, about 30 ms per call (uniform 25-35 ms),
a queue of 64 and 503 + ``Retry-After: 1`` past it, runs in its own process (a
minimal aiohttp.web server on 127.0.0.1). The same number of calls go through:

- ``blocking``: requests + ThreadPoolExecutor(8), one session with a 20-connection
  pool, every call handed to the pool at once (E3's published setup);
- ``aiohttp-200``: a plain aiohttp session (pool 200) at a fixed concurrency of 200
  (``bounded_map``), no retries;
- ``adaptive``: ``AdaptiveClient`` with its defaults (no configured concurrency),
  fed by ``client.map``; ``adaptive-<limit>`` with another limit: a
  ``make_limit`` spec (``adaptive-gradient``), ``aimd/<backoff ratio>``
  (``adaptive-aimd/0.5``), either followed by ``@<N>`` for one update per N calls.

Per variant: throughput of successful calls and its share of the upstream's
capacity (slots / mean service time), the upstream's slot utilisation (measured by
the server), latency percentiles of successful calls (from hand-over to answer),
time queued in the client versus time at the upstream, 503s seen by the upstream
and returned to the caller, and timeouts (5 s per call).

    .venv/bin/python bench/e3_remote_inference.py            # 20,000 calls per variant
    .venv/bin/python bench/e3_remote_inference.py --full     # 100,000 calls
    .venv/bin/python bench/e3_remote_inference.py --quick    # 4,000 calls
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import click
import requests
from aiohttp import web
from requests.adapters import HTTPAdapter

from loadshed.bounded import bounded_map
from loadshed.client import AdaptiveClient, Response, default_client_limit
from loadshed.errors import ConfigError, Rejected
from loadshed.histogram import LatencyHistogram
from loadshed.limits import AIMD, LimitAlgorithm, Windowed, make_limit

SLOTS = 16
WORK_LOW_S = 0.025
WORK_HIGH_S = 0.035
CAPACITY = SLOTS / ((WORK_LOW_S + WORK_HIGH_S) / 2)  # calls per second
CALL_TIMEOUT_S = 5.0


# ---------------------------------------------------------------- the upstream


class Model:
    """16 slots, a bounded FIFO queue, 503 past it; counts what it did."""

    def __init__(self, slots: int, queue: int) -> None:
        self.slots = slots
        self.queue = queue
        self.semaphore = asyncio.Semaphore(slots)
        self.active = 0
        self.waiting = 0
        self.rng = random.Random(7)
        self.reset()

    def reset(self) -> None:
        self.served = 0
        self.refused = 0
        self.busy_s = 0.0
        self.max_waiting = 0
        self.started = time.monotonic()

    async def predict(self, request: web.Request) -> web.Response:
        await request.read()
        if self.active + self.waiting >= self.slots + self.queue:
            self.refused += 1
            return web.Response(status=503, text="overloaded", headers={"Retry-After": "1"})
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)
        try:
            await self.semaphore.acquire()
        finally:
            self.waiting -= 1
        self.active += 1
        began = time.monotonic()
        try:
            await asyncio.sleep(self.rng.uniform(WORK_LOW_S, WORK_HIGH_S))
        finally:
            self.active -= 1
            self.busy_s += time.monotonic() - began
            self.semaphore.release()
        self.served += 1
        return web.json_response({"label": 1})

    async def stats(self, request: web.Request) -> web.Response:
        elapsed = time.monotonic() - self.started
        payload = {
            "served": self.served,
            "refused": self.refused,
            "utilisation": self.busy_s / (self.slots * elapsed) if elapsed > 0 else 0.0,
            "max_waiting": self.max_waiting,
        }
        if request.method == "POST":
            self.reset()
        return web.json_response(payload)


def serve(port_out: Any, queue: int, use_uvloop: bool) -> None:
    """Child process: run the model server until killed; send the port back."""

    async def main() -> None:
        model = Model(SLOTS, queue)
        app = web.Application()
        app.router.add_post("/predict", model.predict)
        app.router.add_route("*", "/stats", model.stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_out.send(runner.addresses[0][1])
        await asyncio.Event().wait()

    run(main(), use_uvloop)


def run(coroutine: Coroutine[Any, Any, Any], use_uvloop: bool) -> Any:
    if use_uvloop:
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


# ---------------------------------------------------------------- measurement


@dataclass
class Recorder:
    """Latency of successful calls (total, client queue, upstream) and outcome counts."""

    total: LatencyHistogram = field(default_factory=LatencyHistogram)
    queue: LatencyHistogram = field(default_factory=LatencyHistogram)
    upstream: LatencyHistogram = field(default_factory=LatencyHistogram)
    outcomes: Counter[str] = field(default_factory=Counter)

    def success(self, total_s: float, queue_s: float, upstream_s: float) -> None:
        self.outcomes["ok"] += 1
        self.total.record(total_s)
        self.queue.record(queue_s)
        self.upstream.record(upstream_s)


def pct(hist: LatencyHistogram, percentile: float) -> float:
    return hist.percentile(percentile)


@dataclass
class Row:
    variant: str
    calls: int
    ok: int
    wall_s: float
    throughput: float
    capacity_pct: float
    utilisation_pct: float
    p50_s: float
    p90_s: float
    p99_s: float
    queue_p50_s: float
    queue_p99_s: float
    upstream_p50_s: float
    upstream_p99_s: float
    upstream_503: int
    returned_503: int
    timeouts: int
    other_errors: int
    retries: int = 0
    limit_median: float = 0.0
    limit_max: int = 0


# ---------------------------------------------------------------- variants


def blocking(url: str, calls: int, recorder: Recorder) -> dict[str, float]:
    """requests + ThreadPoolExecutor(8), 20-connection pool, all calls submitted at once."""
    session = requests.Session()
    session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=20))
    lock = threading.Lock()

    def call(submitted: float) -> None:
        started = time.monotonic()
        try:
            answer = session.post(url, json={"doc": 1}, timeout=CALL_TIMEOUT_S)
        except requests.Timeout:
            with lock:
                recorder.outcomes["timeout"] += 1
            return
        except requests.RequestException:
            with lock:
                recorder.outcomes["error"] += 1
            return
        finished = time.monotonic()
        with lock:
            if answer.status_code == 200:
                recorder.success(finished - submitted, started - submitted, finished - started)
            else:
                recorder.outcomes[f"http_{answer.status_code}"] += 1

    with ThreadPoolExecutor(max_workers=8) as pool:
        submitted = time.monotonic()
        list(pool.map(call, [submitted] * calls))
    session.close()
    return {}


async def plain_aiohttp(url: str, calls: int, recorder: Recorder) -> dict[str, float]:
    """A plain aiohttp session at a fixed concurrency of 200, no retries."""
    timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def call(index: int) -> None:
            started = time.monotonic()
            try:
                async with session.post(url, json={"doc": index}) as answer:
                    await answer.read()
                    status = answer.status
            except TimeoutError:
                recorder.outcomes["timeout"] += 1
                return
            except aiohttp.ClientError:
                recorder.outcomes["error"] += 1
                return
            elapsed = time.monotonic() - started
            if status == 200:
                recorder.success(elapsed, 0.0, elapsed)
            else:
                recorder.outcomes[f"http_{status}"] += 1

        async for _ in bounded_map(call, range(calls), 200):
            pass
    return {}


def build_limit(limit: str) -> LimitAlgorithm | None:
    """The limit of an ``adaptive-<limit>`` variant: ``default``, a make_limit spec,
    ``aimd/<backoff ratio>``, each optionally ``@<N>`` (one update per N samples)."""
    spec, _, per = limit.partition("@")
    algorithm: LimitAlgorithm | None = None
    if spec.startswith("aimd/"):
        algorithm = AIMD(backoff_ratio=float(spec.partition("/")[2]))
    elif spec != "default":
        algorithm = make_limit(spec)
    if per:
        inner = default_client_limit() if algorithm is None else algorithm
        algorithm = Windowed(inner, window=1e-6, min_samples=int(per))
    return algorithm


async def adaptive(url: str, calls: int, recorder: Recorder, limit: str) -> dict[str, float]:
    """AdaptiveClient, no configured concurrency, fed by client.map."""
    limits: list[int] = []
    async with AdaptiveClient(timeout=CALL_TIMEOUT_S, limit=build_limit(limit)) as client:

        async def call(index: int) -> Response:
            return await client.post(url, json={"doc": index})

        async def watch() -> None:
            while True:
                limits.append(client.limiter.limit)
                await asyncio.sleep(0.1)

        watcher = asyncio.ensure_future(watch())
        try:
            async for result in client.map(call, range(calls), return_exceptions=True):
                if isinstance(result, TimeoutError):
                    recorder.outcomes["timeout"] += 1
                elif isinstance(result, Rejected):
                    recorder.outcomes[f"rejected:{result.reason}"] += 1
                elif isinstance(result, BaseException):
                    recorder.outcomes[f"error:{type(result).__name__}"] += 1
                elif result.status == 200:
                    recorder.success(
                        result.queue_wait_s + result.upstream_s,
                        result.queue_wait_s,
                        result.upstream_s,
                    )
                else:
                    recorder.outcomes[f"http_{result.status}"] += 1
        finally:
            watcher.cancel()
        stats = client.stats()
    return {
        "retries": stats.counts.get("retries", 0),
        "limit_median": statistics.median(limits) if limits else 0,
        "limit_max": max(limits) if limits else 0,
    }


VARIANTS = ("blocking", "aiohttp-200", "adaptive")


def measure(variant: str, base: str, calls: int, use_uvloop: bool) -> tuple[Row, dict[str, Any]]:
    url = f"{base}/predict"
    requests.post(f"{base}/stats", timeout=5)  # reset the server's counters
    recorder = Recorder()
    started = time.monotonic()
    extra: dict[str, float]
    if variant == "blocking":
        extra = blocking(url, calls, recorder)
    elif variant == "aiohttp-200":
        extra = run(plain_aiohttp(url, calls, recorder), use_uvloop)
    else:
        limit = variant.partition("-")[2] or "default"
        extra = run(adaptive(url, calls, recorder, limit), use_uvloop)
    wall_s = time.monotonic() - started
    server = requests.get(f"{base}/stats", timeout=5).json()
    ok = recorder.outcomes["ok"]
    errors = sum(
        count
        for key, count in recorder.outcomes.items()
        if key not in ("ok", "timeout", "http_503")
    )
    row = Row(
        variant=variant if variant != "adaptive" else "adaptive (default)",
        calls=calls,
        ok=ok,
        wall_s=wall_s,
        throughput=ok / wall_s,
        capacity_pct=100 * ok / wall_s / CAPACITY,
        utilisation_pct=100 * server["utilisation"],
        p50_s=pct(recorder.total, 50),
        p90_s=pct(recorder.total, 90),
        p99_s=pct(recorder.total, 99),
        queue_p50_s=pct(recorder.queue, 50),
        queue_p99_s=pct(recorder.queue, 99),
        upstream_p50_s=pct(recorder.upstream, 50),
        upstream_p99_s=pct(recorder.upstream, 99),
        upstream_503=server["refused"],
        returned_503=recorder.outcomes["http_503"],
        timeouts=recorder.outcomes["timeout"],
        other_errors=errors,
        retries=int(extra.get("retries", 0)),
        limit_median=float(extra.get("limit_median", 0)),
        limit_max=int(extra.get("limit_max", 0)),
    )
    return row, {"server": server, "outcomes": dict(recorder.outcomes)}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}" if seconds < 10 else f"{seconds * 1000:.3g}"


@click.command()
@click.option("--calls", type=click.IntRange(min=1), default=20_000, show_default=True)
@click.option("--full", is_flag=True, help="100,000 calls per variant.")
@click.option("--quick", is_flag=True, help="4,000 calls per variant.")
@click.option(
    "--queue",
    type=click.IntRange(min=0),
    default=64,
    show_default=True,
    help="Upstream queue length past which it answers 503.",
)
@click.option(
    "--variant",
    "variants",
    multiple=True,
    help="blocking | aiohttp-200 | adaptive | adaptive-<limit> (e.g. adaptive-little); "
    "repeatable. Default: blocking, aiohttp-200, adaptive.",
)
@click.option(
    "--loop",
    "loop_name",
    type=click.Choice(["uvloop", "asyncio"]),
    default="uvloop",
    show_default=True,
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write JSON.")
def main(
    calls: int,
    full: bool,
    quick: bool,
    queue: int,
    variants: tuple[str, ...],
    loop_name: str,
    json_path: str | None,
) -> None:
    """E3: blocking client vs plain aiohttp vs AdaptiveClient against a 16-slot model."""
    if full and quick:
        raise click.UsageError("--full and --quick: choose one")
    calls = 100_000 if full else 4_000 if quick else calls
    for variant in variants:
        if variant not in VARIANTS and not variant.startswith("adaptive-"):
            raise click.BadParameter(
                f"{variant!r}; allowed: blocking|aiohttp-200|adaptive|adaptive-<limit>",
                param_hint="--variant",
            )
        if variant.startswith("adaptive-"):
            try:
                build_limit(variant.partition("-")[2])
            except (ConfigError, ValueError) as error:
                raise click.BadParameter(f"{variant!r}: {error}", param_hint="--variant") from error
    use_uvloop = loop_name == "uvloop"
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve, args=(child, queue, use_uvloop), daemon=True)
    server.start()
    try:
        port = parent.recv()
        base = f"http://127.0.0.1:{port}"
        click.echo(
            f"E3: {calls:,} calls per variant; upstream {SLOTS} slots x "
            f"{WORK_LOW_S * 1000:.0f}-{WORK_HIGH_S * 1000:.0f} ms, queue {queue}, "
            f"capacity {CAPACITY:.0f} calls/s; call timeout {CALL_TIMEOUT_S:.0f} s; {loop_name}"
        )
        rows: list[Row] = []
        details: dict[str, Any] = {}
        for variant in variants or VARIANTS:
            row, detail = measure(variant, base, calls, use_uvloop)
            rows.append(row)
            details[row.variant] = detail
            click.echo(f"  {row.variant}: {row.wall_s:.1f} s, {detail}")
    finally:
        server.kill()
        server.join()
    click.echo("")
    click.echo(
        "| client | ok calls/s | % of capacity | upstream busy | p50 ms | p90 ms | p99 ms "
        "| queue p50/p99 ms | upstream p50/p99 ms | 503 at upstream | 503 returned "
        "| timeouts | other errors |"
    )
    click.echo("| --- |" + " ---: |" * 12)
    for row in rows:
        click.echo(
            f"| {row.variant} | {row.throughput:.0f} | {row.capacity_pct:.1f} % "
            f"| {row.utilisation_pct:.1f} % | {ms(row.p50_s)} | {ms(row.p90_s)} "
            f"| {ms(row.p99_s)} | {ms(row.queue_p50_s)} / {ms(row.queue_p99_s)} "
            f"| {ms(row.upstream_p50_s)} / {ms(row.upstream_p99_s)} | {row.upstream_503} "
            f"| {row.returned_503} | {row.timeouts} | {row.other_errors} |"
        )
    adaptive_rows = [row for row in rows if row.variant.startswith("adaptive")]
    for row in adaptive_rows:
        click.echo(
            f"{row.variant}: limit median {row.limit_median:.0f}, max {row.limit_max}; "
            f"retries {row.retries}"
        )
    if json_path:
        payload = {
            "calls": calls,
            "queue": queue,
            "capacity": CAPACITY,
            "rows": [asdict(row) for row in rows],
            "details": details,
        }
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
