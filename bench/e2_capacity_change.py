"""E2, live: the origin's capacity halves at run time; who keeps serving?

    .venv/bin/python bench/e2_capacity_change.py [--scale 0.25] [--rows none,haproxy,aimd]

Real processes on loopback: the demo ``origin`` (7 workers, queue 100, work time 1 s x
scale) and, per row, nothing / HAProxy (``maxconn 7``, ``timeout queue`` set by hand) /
``loadshed proxy`` with ``fixed:5`` (E2's fixed quota), ``aimd`` and ``little`` (the
default). An open-loop client in this script sends 5/7 of the origin's capacity
(5 req/s / scale) with at most 10 outstanding (E2's 10 client workers) and a timeout of
2.5 service times; arrivals while 10 are outstanding are counted as not sent (failed).
After ``--before`` scaled seconds the origin's work time doubles (``PUT
/admin/work-time``): capacity drops from 7 to 3.5 req/s (scaled).

Every figure is in *scaled* units, comparable with E2's published ones: rates in
requests per scaled second (real x scale), times in scaled seconds (real / scale).
Reported per row: successes/s before the change; after it, over the steady part
(``--settle`` scaled seconds after the change to the end) and over all of it; % of the
new capacity; p99 of successes after the change; timeouts, rejections (503/504/502)
and not-sent; the goodput settle time (from the change until the rolling 5-scaled-second
goodput stays >= 80 % of the row's steady goodput); for loadshed rows the limit before
and after the change and when it converged (the last time it was outside the band it
keeps over the last half of the run: 10th..90th percentile +-1).

A row ``LIMIT+close`` (e.g. ``little+close``) runs the proxy with ``--close-abandoned``:
requests that time out release their slot at once although the origin keeps working.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from proxy_procs import ORIGIN_APP, PYTHON, free_port, proxy_command, started

WORKERS = 7
SERVICE_S = 1.0  # E2's work time before the change (scaled seconds)
SERVICE_AFTER_S = 2.0
RATE = 5.0  # E2's client rate, requests per scaled second
MAX_OUTSTANDING = 10  # E2's client workers
TIMEOUT_SERVICE_TIMES = 2.5
ORIGIN_QUEUE = 100
ROWS = ("none", "haproxy", "fixed:5", "aimd", "little")


@dataclass
class Request:
    """One scheduled request: when it was due (real s from start) and what became of it."""

    due: float
    outcome: str = "not_sent"  # ok | timeout | rejected | error | not_sent
    status: int = 0
    latency: float = math.nan  # real seconds from due time to the answer


@dataclass
class RowResult:
    row: str
    requests: list[Request] = field(default_factory=list)
    limits: list[tuple[float, float]] = field(default_factory=list)  # (real s, limit)


async def drive(
    url: str, scale: float, before: float, after: float, origin: str, metrics: str | None
) -> RowResult:
    """Open-loop load, the capacity change at ``before`` scaled seconds, limit scraping."""
    rate = RATE / scale
    timeout = TIMEOUT_SERVICE_TIMES * SERVICE_S * scale
    total = (before + after) * scale
    change_at = before * scale
    result = RowResult(row="")
    outstanding = 0
    tasks: list[asyncio.Task[None]] = []
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:

        async def one(request: Request) -> None:
            nonlocal outstanding
            outstanding += 1
            try:
                async with session.get(url + "/work") as response:
                    await response.read()
                    request.status = response.status
                    request.outcome = "ok" if response.status == 200 else "rejected"
            except asyncio.TimeoutError:
                request.outcome = "timeout"
            except aiohttp.ClientError:
                request.outcome = "error"
            finally:
                outstanding -= 1
                request.latency = (loop.time() - start) - request.due
                if request.outcome == "timeout":
                    request.latency = timeout

        async def change() -> None:
            await asyncio.sleep(change_at)
            payload = {"seconds": SERVICE_AFTER_S * scale}
            async with session.put(origin + "/admin/work-time", json=payload) as response:
                response.raise_for_status()

        async def scrape() -> None:
            assert metrics is not None
            pattern = re.compile(r"^loadshed_limit\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
            while True:
                try:
                    async with session.get(metrics) as response:
                        text = await response.text()
                    found = pattern.search(text)
                    if found:
                        result.limits.append((loop.time() - start, float(found.group(1))))
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.25 * scale)

        loop = asyncio.get_running_loop()
        start = loop.time()
        helpers = [asyncio.ensure_future(change())]
        if metrics is not None:
            helpers.append(asyncio.ensure_future(scrape()))
        index = 0
        while True:
            due = index / rate
            if due >= total:
                break
            delay = start + due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            request = Request(due=due)
            result.requests.append(request)
            if outstanding < MAX_OUTSTANDING:
                tasks.append(asyncio.ensure_future(one(request)))
            index += 1
        await asyncio.gather(*tasks)
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
    return result


def haproxy_head(*defaults: str) -> str:
    """HAProxy's ``global`` and ``defaults`` sections for a loopback bench (HTTP mode,
    generous client/server timeouts), with ``defaults`` lines added."""
    extra = "".join(f"    {line}\n" for line in defaults)
    return f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
{extra}"""


def haproxy_config(port: int, origin_port: int, queue_timeout_ms: int) -> str:
    return (
        haproxy_head(f"timeout queue {queue_timeout_ms}ms")
        + f"""frontend e2
    bind 127.0.0.1:{port}
    default_backend origin
backend origin
    server origin 127.0.0.1:{origin_port} maxconn {WORKERS}
"""
    )


def ensure_haproxy() -> str | None:
    found = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    if found:
        return found
    print("haproxy missing: apt-get install -y haproxy", file=sys.stderr)
    install = subprocess.run(
        ["apt-get", "install", "-y", "haproxy"], capture_output=True, text=True, check=False
    )
    if install.returncode != 0:
        print(f"could not install haproxy: {install.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return shutil.which("haproxy") or "/usr/sbin/haproxy"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def summarize(
    result: RowResult, scale: float, before: float, after: float, settle: float
) -> dict[str, Any]:
    """Figures in scaled units (see the module docstring)."""
    change = before * scale
    end = (before + after) * scale
    steady_from = change + settle * scale
    warm = min(5.0, before / 2) * scale

    def window(lo: float, hi: float) -> list[Request]:
        return [r for r in result.requests if lo <= r.due < hi]

    def goodput(requests: list[Request], lo: float, hi: float) -> float:
        return sum(r.outcome == "ok" for r in requests) / ((hi - lo) / scale)

    pre = window(warm, change)
    post = window(change, end)
    steady = window(steady_from, end)
    steady_goodput = goodput(steady, steady_from, end)
    # goodput settle: rolling 5 scaled s of successes (by due time) >= 80 % of the row's
    # steady goodput from then on (small windows hold ~17 requests: 80 % absorbs the noise)
    step, span = 0.5 * scale, 5.0 * scale
    settle_time = math.nan
    last_bad: float | None = None
    t = change
    while t + span <= end + 1e-9:
        if goodput(window(t, t + span), t, t + span) < 0.8 * steady_goodput:
            last_bad = t
        t += step
    if steady_goodput > 0:
        settle_time = 0.0 if last_bad is None else (last_bad + step - change) / scale
    # limit convergence: from the change, the time after which every sample stays in the
    # band the limit keeps over the last half of the run (its 10th..90th percentile, +-1)
    converge_time = math.nan
    after_limits = [(t, v) for t, v in result.limits if t >= change]
    tail = [v for t, v in after_limits if t >= (change + end) / 2]
    if tail:
        low, high = percentile(tail, 0.10) - 1, percentile(tail, 0.90) + 1
        outside = [t for t, v in after_limits if not low <= v <= high]
        converge_time = 0.0 if not outside else (max(outside) - change) / scale
    ok_latencies = [r.latency / scale for r in post if r.outcome == "ok"]
    limits_before = [v for t, v in result.limits if warm <= t < change]
    limits_after = [v for t, v in result.limits if steady_from <= t < end]
    return {
        "row": result.row,
        "before_goodput": goodput(pre, warm, change),
        "after_goodput": goodput(post, change, end),
        "steady_goodput": steady_goodput,
        "steady_pct_capacity": 100.0 * steady_goodput / (WORKERS / SERVICE_AFTER_S),
        "p99_after_s": percentile(ok_latencies, 0.99),
        "p50_after_s": percentile(ok_latencies, 0.50),
        "timeouts_after": sum(r.outcome == "timeout" for r in post),
        "rejected_after": sum(r.outcome == "rejected" for r in post),
        "errors_after": sum(r.outcome == "error" for r in post),
        "not_sent_after": sum(r.outcome == "not_sent" for r in post),
        "sent_after": len(post),
        "settle_s": settle_time,
        "limit_converged_s": converge_time,
        "limit_before": (min(limits_before), max(limits_before)) if limits_before else None,
        "limit_after": (min(limits_after), max(limits_after)) if limits_after else None,
    }


async def run_row(
    row: str, args: argparse.Namespace, haproxy: str | None, queue_s: float = 0.5
) -> RowResult | None:
    scale = args.scale
    origin_port = free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    origin_cmd = [
        PYTHON, "-c", ORIGIN_APP, str(origin_port), str(WORKERS), str(SERVICE_S * scale),
        str(ORIGIN_QUEUE),
    ]  # fmt: skip
    timeout = TIMEOUT_SERVICE_TIMES * SERVICE_S * scale
    with started(origin_cmd, origin_port):
        if row == "none":
            result = await drive(origin, scale, args.before, args.after, origin, None)
        elif row == "haproxy":
            if haproxy is None:
                return None
            port = free_port()
            queue_ms = round(queue_s * scale * 1000)
            with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as cfg:
                cfg.write(haproxy_config(port, origin_port, queue_ms))
            try:
                with started([haproxy, "-db", "-f", cfg.name], port):
                    result = await drive(
                        f"http://127.0.0.1:{port}", scale, args.before, args.after, origin, None
                    )
            finally:
                os.unlink(cfg.name)
        else:
            port, metrics_port = free_port(), free_port()
            extra = ["--deadline", f"{timeout:.4f}s", "--metrics-port", str(metrics_port)]
            limit, _, option = row.partition("+")
            if option == "close":  # e.g. little+close: cut abandoned requests off
                extra.append("--close-abandoned")
            with started(proxy_command(origin, port, limit, *extra), port):
                result = await drive(
                    f"http://127.0.0.1:{port}",
                    scale,
                    args.before,
                    args.after,
                    origin,
                    f"http://127.0.0.1:{metrics_port}/metrics",
                )
    result.row = row if row != "haproxy" else f"haproxy (maxconn 7, timeout queue {queue_s:g}s)"
    return result


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=0.25, help="time scale (1 = E2's seconds)")
    parser.add_argument(
        "--before", type=float, default=20.0, help="scaled seconds before the change"
    )
    parser.add_argument("--after", type=float, default=60.0, help="scaled seconds after it")
    parser.add_argument("--settle", type=float, default=10.0, help="scaled s excluded after it")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma list of " + "|".join(ROWS))
    parser.add_argument(
        "--haproxy-queue", default="0.5,1",
        help="HAProxy timeout queue values in scaled s, one row each (hand-tuned: 0.5 = client "
        "timeout - new work time)",
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="run every row this many times")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    haproxy = ensure_haproxy() if "haproxy" in rows else None
    summaries: list[dict[str, Any]] = []
    series: dict[str, Any] = {}
    queues = [float(q) for q in args.haproxy_queue.split(",") if q.strip()]
    runs = [
        (row, q, k)
        for k in range(1, args.repeat + 1)
        for row in rows
        for q in (queues if row == "haproxy" else [0.0])
    ]
    for row, queue_s, attempt in runs:
        started_at = time.monotonic()
        result = asyncio.run(run_row(row, args, haproxy, queue_s))
        if result is not None and args.repeat > 1:
            result.row += f" #{attempt}"
        if result is None:
            print(f"{row}: skipped (haproxy unavailable)", file=sys.stderr)
            continue
        summary = summarize(result, args.scale, args.before, args.after, args.settle)
        summaries.append(summary)
        series[result.row] = {
            "limits": result.limits,
            "requests": [(r.due, r.outcome, r.latency) for r in result.requests],
        }
        print(
            f"{result.row}: {summary['steady_goodput']:.2f} ok/s after the change "
            f"({summary['steady_pct_capacity']:.0f}% of capacity), "
            f"{time.monotonic() - started_at:.0f}s",
            file=sys.stderr,
        )

    print(
        f"\nE2 live, scale {args.scale:g}: origin {WORKERS} workers, work {SERVICE_S:g} -> "
        f"{SERVICE_AFTER_S:g} s at t={args.before:g} s; client {RATE:g} req/s, <= "
        f"{MAX_OUTSTANDING} outstanding, timeout {TIMEOUT_SERVICE_TIMES * SERVICE_S:g} s; "
        f"capacity 7 -> 3.5 req/s (all in scaled units)\n"
    )
    print(
        "| row | ok/s before | ok/s after (steady) | % of 3.5 | ok/s after (all) | p99 after s "
        "| p50 after s | timeouts | rejected | not sent | goodput settled s | limit before "
        "| limit after | limit converged s |"
    )
    print("| --- |" + " ---: |" * 13)
    for s in summaries:
        lb = s["limit_before"]
        la = s["limit_after"]
        print(
            f"| {s['row']} | {fmt(s['before_goodput'])} | {fmt(s['steady_goodput'])} "
            f"| {fmt(s['steady_pct_capacity'], 0)} | {fmt(s['after_goodput'])} "
            f"| {fmt(s['p99_after_s'])} | {fmt(s['p50_after_s'])} | {s['timeouts_after']} "
            f"| {s['rejected_after'] + s['errors_after']} | {s['not_sent_after']} "
            f"| {fmt(s['settle_s'], 1)} "
            f"| {'-' if lb is None else f'{lb[0]:g}..{lb[1]:g}'} "
            f"| {'-' if la is None else f'{la[0]:g}..{la[1]:g}'} "
            f"| {fmt(s['limit_converged_s'], 1)} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "rows": summaries, "series": series}))  # fmt: skip


if __name__ == "__main__":
    main()
