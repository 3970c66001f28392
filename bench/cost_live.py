"""Issue 16, live: the digits demo with batches of 1..256 images and deadlines, cost-aware
admission against cost-blind, side by side.

    .venv/bin/python bench/cost_live.py [--duration 20s] [--load 2] [--timeout-x 3]
        [--repeats 2] [--seed 1] [--out FILE.md] [--json FILE]

Each step starts ``loadshed serve-demo --model digits --protect little`` (one worker
process, the default limit and queue) on a free loopback port, in its own session, and
stops it after. The load is open loop: Poisson arrivals at ``--load`` x the capacity,
each request a batch of a log-uniform number of images in 1..256 (seeded: every step
sends the same sizes at the same times), with the client timeout sent as
``X-Request-Timeout``. *aware* also sends ``X-Request-Cost: <rows>``; *blind* does not,
so the server judges every batch on its recent mean. *shortest* sends the costs to a
server whose queue grants the shortest predicted batch first (``serve-demo
--discipline shortest``). ``--variants`` chooses which run (default ``aware,blind``);
they take turns, ``--repeats`` times each, each repeat starting one later in the list.

Capacity and timeout come from a calibration on an unprotected server first: one
closed-loop client sending the same size mix for 5 s; capacity = 1 / its mean latency,
the client timeout = ``--timeout-x`` x that mean. A 2 s warm-up at the step's load
precedes each measured window (the cost model is fitted by then).

Reported per variant, median over repeats: goodput (successes within the timeout per
second) as a share of capacity, rows served within the timeout per second, 503s by
reason with their median latency (a ``deadline`` refusal at arrival answers at once),
and client timeouts; and, by batch size (1-4, 5-16, 17-64, 65-256 rows), the shares of
requests served in time, refused and timed out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from loadshed.units import parse_duration
from servers import free_port, wait_for_port

MAX_ROWS = 256
# Batch sizes reported apart (upper edges, rows): who is served, refused and timed out.
BANDS = (4, 16, 64, 256)


def band_of(rows: int) -> str:
    low = 1
    for top in BANDS:
        if rows <= top:
            return f"{low}-{top}"
        low = top + 1
    raise ValueError(rows)


def _p99(late: list[float], index_count: int) -> float:
    """The 99th percentile of lateness over all sends (those on time count as 0)."""
    if not late or index_count <= 0:
        return 0.0
    ordered = sorted(late, reverse=True)
    rank = int(0.01 * index_count)
    return ordered[rank] if rank < len(ordered) else 0.0


def bodies() -> dict[int, bytes]:
    """A JSON body per batch size, from the digits images (cycled)."""
    from sklearn.datasets import load_digits

    features, _ = load_digits(return_X_y=True)
    images = [[int(v) for v in row] for row in features]
    return {
        rows: json.dumps({"batch": [images[i % len(images)] for i in range(rows)]}).encode()
        for rows in range(1, MAX_ROWS + 1)
    }


def draw_sizes(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [
        min(MAX_ROWS, int(math.exp(rng.uniform(0, math.log(MAX_ROWS + 1))))) for _ in range(count)
    ]


# variant -> (sends the cost, the server's queue discipline)
VARIANTS = {"aware": (True, "fifo"), "blind": (False, "fifo"), "shortest": (True, "shortest")}


class Server:
    """``loadshed serve-demo --model digits`` in its own session."""

    def __init__(self, protect: str, discipline: str = "fifo") -> None:
        self.port = free_port()
        command = [
            sys.executable, "-m", "loadshed", "serve-demo", "--model", "digits",
            "--protect", protect, "--discipline", discipline,
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        wait_for_port(self.port, 60, "serve-demo")
        self.url = f"http://127.0.0.1:{self.port}/predict"

    def gauges(self) -> dict[str, float]:
        """The limiter's gauges from /metrics (limit, service time, fitted cost model)."""
        import urllib.request

        wanted = (
            "loadshed_limit",
            "loadshed_service_time_estimate_seconds",
            "loadshed_cost_model_intercept_seconds",
            "loadshed_cost_model_slope_seconds",
        )
        url = self.url.replace("/predict", "/metrics")
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            name, _, value = line.partition("{")
            if name in wanted:
                values[name.removeprefix("loadshed_")] = float(value.rpartition(" ")[2])
        return values

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@dataclass
class Tally:
    ok: int = 0
    ok_rows: int = 0
    timeouts: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    refused_latency: dict[str, list[float]] = field(default_factory=dict)
    other: int = 0
    late: list[float] = field(default_factory=list)  # driver: seconds behind schedule
    # per batch-size band: outcome ("ok", "timeout", "refused", "other") -> count
    by_band: dict[str, Counter[str]] = field(default_factory=dict)

    def count(self, rows: int, outcome: str) -> None:
        self.by_band.setdefault(band_of(rows), Counter())[outcome] += 1


async def one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    rows: int,
    timeout: float,
    aware: bool,
    tally: Tally | None,
) -> None:
    headers = {"Content-Type": "application/json", "X-Request-Timeout": f"{timeout:.4f}"}
    if aware:
        headers["X-Request-Cost"] = str(rows)
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            async with session.post(url, data=body, headers=headers) as response:
                payload = await response.read()
                status = response.status
    except TimeoutError:
        if tally is not None:
            tally.timeouts += 1
            tally.count(rows, "timeout")
        return
    except aiohttp.ClientError:
        if tally is not None:
            tally.other += 1
            tally.count(rows, "other")
        return
    if tally is None:
        return
    elapsed = time.perf_counter() - started
    if status == 200:
        tally.ok += 1
        tally.ok_rows += rows
        tally.count(rows, "ok")
    elif status == 503:
        reason = json.loads(payload).get("reason", "?")
        tally.refused[reason] += 1
        tally.refused_latency.setdefault(reason, []).append(elapsed)
        tally.count(rows, "refused")
    else:
        tally.other += 1
        tally.count(rows, "other")


async def closed_loop(
    url: str, sizes: list[int], payloads: dict[int, bytes], seconds: float
) -> float:
    """One client for ``seconds``: the mean latency over the size mix."""
    latencies = []
    async with aiohttp.ClientSession() as session:
        end = time.perf_counter() + seconds
        index = 0
        while time.perf_counter() < end:
            rows = sizes[index % len(sizes)]
            index += 1
            started = time.perf_counter()
            async with session.post(
                url, data=payloads[rows], headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)
    return statistics.fmean(latencies[5:])


async def open_loop(
    url: str,
    rate: float,
    seconds: float,
    warmup: float,
    sizes: list[int],
    payloads: dict[int, bytes],
    timeout: float,
    aware: bool,
    seed: int,
) -> Tally:
    # A stream of its own: drawn from Random(seed) like the sizes, the i-th gap and the
    # i-th size came from the same uniform number, so big batches always followed long
    # gaps (an idle server) and small ones came in bunches.
    rng = random.Random(f"{seed}:arrivals")
    tally = Tally()
    tasks: set[asyncio.Task[None]] = set()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        at = 0.0
        index = 0
        while at < warmup + seconds:
            at += rng.expovariate(rate)
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif at >= warmup:
                tally.late.append(-delay)
            rows = sizes[index % len(sizes)]
            index += 1
            measured = tally if at >= warmup else None
            task = asyncio.ensure_future(
                one(session, url, payloads[rows], rows, timeout, aware, measured)
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", default="20s")
    parser.add_argument("--warmup", default="2s")
    parser.add_argument("--load", type=float, default=2.0)
    parser.add_argument("--timeout-x", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--variants",
        default="aware,blind",
        help=f"Comma-separated, from {','.join(VARIANTS)} (default aware,blind).",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants or len(set(variants)) != len(variants):
        parser.error(f"--variants: got {args.variants!r}, allowed: {','.join(VARIANTS)}")
    duration = parse_duration(args.duration, "duration")
    warmup = parse_duration(args.warmup, "warmup")
    payloads = bodies()
    sizes = draw_sizes(100_000, args.seed)

    server = Server("none")
    try:
        mean = asyncio.run(closed_loop(server.url, sizes, payloads, 5.0))
    finally:
        server.stop()
    capacity = 1.0 / mean
    timeout = args.timeout_x * mean
    rate = args.load * capacity
    print(
        f"calibration: mean {mean * 1000:.1f} ms over the size mix, capacity {capacity:.1f} "
        f"req/s; rate {rate:.1f} req/s, timeout {timeout * 1000:.0f} ms",
        file=sys.stderr,
    )
    results: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for repeat in range(args.repeats):
        turn = repeat % len(variants)
        for variant in variants[turn:] + variants[:turn]:
            sends_cost, discipline = VARIANTS[variant]
            server = Server("little", discipline)
            try:
                tally = asyncio.run(
                    open_loop(
                        server.url, rate, duration, warmup, sizes, payloads, timeout,
                        sends_cost, args.seed,
                    )
                )  # fmt: skip
                gauges = server.gauges()
            finally:
                server.stop()
            row = {
                "goodput_rps": tally.ok / duration,
                "goodput_share": tally.ok / duration / capacity,
                "rows_per_s": tally.ok_rows / duration,
                "timeouts": tally.timeouts,
                "refused": dict(tally.refused),
                "refused_p50_ms": {
                    reason: 1000 * statistics.median(values)
                    for reason, values in tally.refused_latency.items()
                },
                "other": tally.other,
                "by_band": {band: dict(counts) for band, counts in tally.by_band.items()},
                "server_at_end": gauges,
                # how far behind its schedule the driver sent (p99): beyond a fraction
                # of the timeout, the load generator, not the server, is measured
                "driver_late_p99_ms": 1000 * _p99(tally.late, index_count=round(rate * duration)),
            }
            results[variant].append(row)
            print(f"{variant} run {repeat + 1}: {json.dumps(row)}", file=sys.stderr)

    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in results[variant])

    command = "python bench/cost_live.py " + " ".join(sys.argv[1:])
    lines = [
        "# Cost-aware admission, live (digits demo, batches of 1..256 images)",
        "",
        f"`{command.strip()}`",
        "",
        f"Calibration: mean {mean * 1000:.1f} ms per request over the size mix (one client, "
        f"unprotected), capacity {capacity:.1f} req/s; offered {rate:.1f} req/s "
        f"({args.load:g}x), client timeout {timeout * 1000:.0f} ms sent as X-Request-Timeout. "
        f"Medians over {args.repeats} runs of {duration:g} s per variant.",
        "",
        "| variant | goodput, share of capacity | rows/s within the timeout | client timeouts "
        "| 503 deadline (p50 ms) | 503 other | driver late p99 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant in variants:
        runs = results[variant]
        deadline = statistics.median(r["refused"].get("deadline", 0) for r in runs)
        deadline_ms = [r["refused_p50_ms"].get("deadline") for r in runs]
        known = [v for v in deadline_ms if v is not None]
        other = statistics.median(
            sum(n for reason, n in r["refused"].items() if reason != "deadline") for r in runs
        )
        refusals = (
            f"{deadline:.0f} ({statistics.median(known):.1f})" if known else f"{deadline:.0f}"
        )
        lines.append(
            f"| {variant} | {median(variant, 'goodput_share'):.2f} | "
            f"{median(variant, 'rows_per_s'):.0f} | {median(variant, 'timeouts'):.0f} | "
            f"{refusals} | {other:.0f} | {median(variant, 'driver_late_p99_ms'):.1f} |"
        )
    bands = [band_of(top) for top in BANDS]
    lines += [
        "",
        "By batch size, all runs together: requests sent, and the shares served in time, "
        f"refused (503) and timed out ({' / '.join(variants)}):",
        "",
        "| rows | sent | served | refused | timed out |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for band in bands:
        cells = []
        for variant in variants:
            total: Counter[str] = Counter()
            for run in results[variant]:
                total.update(run["by_band"].get(band, {}))
            cells.append(total)
        sent = [sum(c.values()) for c in cells]
        shares = {
            outcome: " / ".join(
                f"{c[outcome] / n:.2f}" if n else "-" for c, n in zip(cells, sent, strict=True)
            )
            for outcome in ("ok", "refused", "timeout")
        }
        lines.append(
            f"| {band} | {' / '.join(f'{n:,}' for n in sent)} | {shares['ok']} "
            f"| {shares['refused']} "
            f"| {shares['timeout']} |"
        )
    lines += ["", "Every run (goodput share; the server's limit at the end; fitted a, b):", ""]
    for variant in variants:
        for number, run in enumerate(results[variant], 1):
            g = run["server_at_end"]
            lines.append(
                f"- {variant} {number}: {run['goodput_share']:.2f}; limit {g.get('limit', 0):g}; "
                f"a {1000 * g.get('cost_model_intercept_seconds', math.nan):.2f} ms, "
                f"b {1e6 * g.get('cost_model_slope_seconds', math.nan):.1f} us/row"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"mean_s": mean, "capacity": capacity, "rate": rate, "timeout_s": timeout,
                       "runs": results}, out, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
