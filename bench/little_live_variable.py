"""Live check of limits on a model with variable service times (issue 12, item 4).

    .venv/bin/python bench/little_live_variable.py [--duration 60s] [--warmup 10s] [--seed 1]
        [--limits little,gradient2,fixed:32] [--out bench/results/little_live_variable.md]

Real processes on loopback, one limit after the other in one run. For each limit: a
fresh origin, ``loadshed serve-demo --model origin --protect none --workers 32
--service-time 0.2 --service-dist exponential --seed SEED`` (32 slots of exponential
200 ms work, asyncio sleeps; its own queue of 100 past the slots, 503 beyond), and in
front of it ``loadshed proxy --limit LIMIT`` (its defaults otherwise: queue of 1000,
hold abandoned requests). The load is ``loadshed bench``: open loop, Poisson arrivals
at 1.5x capacity (capacity = 32 / 0.2 s = 160 req/s, so 240 req/s), client timeout
0.6 s sent as a deadline (``X-Request-Timeout``, ``--send-deadline``), seeded.

Reported per limit: goodput (2xx within the timeout, per second of the measured
window) as a share of capacity, throughput, timeouts, rejections, p50/p99 of
successes, and the proxy's limit (``loadshed_limit`` scraped every 0.5 s: mean, min
and max over the window); then goodput of ``little`` over ``fixed:32`` (the issue's
target: >= 0.90). Writes the markdown table to ``--out`` and every figure (including
each bench JSON's summary fields) to a ``.json`` beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from loadshed.errors import ConfigError
from loadshed.limits import make_limit
from loadshed.units import parse_duration
from proxy_procs import PYTHON, free_port, proxy_command, started

WORKERS = 32
SERVICE_S = 0.2
SERVICE_DIST = "exponential"
CAPACITY_RPS = WORKERS / SERVICE_S  # 160 req/s
LOAD = 1.5  # x capacity
TIMEOUT_S = 0.6
DEFAULT_LIMITS = "little,gradient2,fixed:32"
DEFAULT_OUT = Path(__file__).parent / "results" / "little_live_variable.md"
_LIMIT_LINE = re.compile(r"^loadshed_limit\{[^}]*\} ([0-9.eE+-]+)$", re.MULTILINE)


def origin_command(port: int, seed: int) -> list[str]:
    """The bare origin: ``serve-demo --model origin`` with the live check's settings."""
    return [
        PYTHON, "-m", "loadshed.cli", "serve-demo", "--model", "origin", "--protect", "none",
        "--workers", str(WORKERS), "--service-time", str(SERVICE_S),
        "--service-dist", SERVICE_DIST, "--seed", str(seed),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip


def bench_command(url: str, duration: float, warmup: float, seed: int, out: str) -> list[str]:
    """``loadshed bench``: open-loop Poisson at 1.5x capacity, 0.6 s timeout sent as deadline."""
    return [
        PYTHON, "-m", "loadshed.cli", "bench", url,
        "--rate", f"{LOAD * CAPACITY_RPS:g}", "--arrival", "poisson", "--seed", str(seed),
        "--timeout", f"{TIMEOUT_S:g}s", "--send-deadline",
        "--duration", f"{duration:g}s", "--warmup", f"{warmup:g}s", "--quiet", "--json", out,
    ]  # fmt: skip


class LimitScraper:
    """Reads the proxy's ``loadshed_limit`` every ``period`` seconds in a thread."""

    def __init__(self, url: str, period: float = 0.5) -> None:
        self.url = url
        self.period = period
        self.samples: list[tuple[float, float]] = []  # (monotonic time, limit)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="limit-scraper", daemon=True)

    def __enter__(self) -> LimitScraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                with urllib.request.urlopen(self.url, timeout=1.0) as response:
                    text = response.read().decode()
            except OSError:
                continue
            found = _LIMIT_LINE.search(text)
            if found:
                self.samples.append((time.monotonic(), float(found.group(1))))

    def between(self, start: float, end: float) -> list[float]:
        """Limits scraped in [start, end)."""
        return [value for at, value in self.samples if start <= at < end]


def run_limit(limit: str, args: argparse.Namespace) -> dict[str, Any]:
    """One limit: fresh origin and proxy, one bench run; the row of figures."""
    origin_port, port, metrics_port = free_port(), free_port(), free_port()
    origin = f"http://127.0.0.1:{origin_port}"
    proxy = proxy_command(origin, port, limit, "--metrics-port", str(metrics_port))
    row: dict[str, Any] = {"limit": limit}
    with tempfile.TemporaryDirectory() as scratch:
        result_path = str(Path(scratch) / "bench.json")
        command = bench_command(
            f"http://127.0.0.1:{port}/work", args.duration, args.warmup, args.seed, result_path
        )
        with (
            started(origin_command(origin_port, args.seed), origin_port),
            started(proxy, port),
            LimitScraper(f"http://127.0.0.1:{metrics_port}/metrics") as scraper,
        ):
            began = time.monotonic()
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                check=False,
                timeout=args.duration + args.warmup + 120,
            )
            ended = time.monotonic()
        if done.returncode != 0 or not Path(result_path).exists():
            lines = (done.stderr or done.stdout).strip().splitlines()
            row["error"] = f"bench exit {done.returncode}: " + (lines[-1] if lines else "")
            return row
        result = json.loads(Path(result_path).read_text())
    # The measured window is the last ``duration`` seconds of the bench run, give or take
    # the tail it waits for (at most the timeout).
    limits = scraper.between(began + args.warmup, ended)
    errors = result.get("errors", {})
    statuses = {str(k): v for k, v in result.get("status_counts", {}).items()}
    success = result.get("latency_s", {}).get("success", {})
    goodput = float(result["goodput_rps"])
    row.update(
        {
            "goodput_rps": goodput,
            "goodput_share": goodput / CAPACITY_RPS,
            "throughput_rps": result.get("throughput_rps"),
            "requests": result.get("requests"),
            "not_sent": result.get("not_sent"),
            "timeouts": errors.get("timeout", 0),
            "rejected": sum(v for k, v in statuses.items() if k in ("503", "429", "504")),
            "status_counts": statuses,
            "errors": errors,
            "p50_success_s": success.get("p50"),
            "p99_success_s": success.get("p99"),
            "limit_mean": sum(limits) / len(limits) if limits else None,
            "limit_min": min(limits) if limits else None,
            "limit_max": max(limits) if limits else None,
        }
    )
    return row


def fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, ratio: float | None) -> str:
    lines = [
        f"Live: `loadshed proxy` in front of `serve-demo --model origin --workers {WORKERS} "
        f"--service-time {SERVICE_S:g} --service-dist {SERVICE_DIST} --seed {args.seed}` "
        f"(capacity {CAPACITY_RPS:g} req/s); open-loop Poisson at {LOAD:g}x "
        f"({LOAD * CAPACITY_RPS:g} req/s), timeout {TIMEOUT_S:g} s sent as a deadline; "
        f"{args.duration:g} s measured after {args.warmup:g} s of warm-up per limit.",
        "",
        "| limit | goodput / capacity | goodput/s | throughput/s | timeouts | rejected "
        "| p50 ok ms | p99 ok ms | limit mean (min..max) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['limit']} | {row['error']} |" + " |" * 7)
            continue
        p50, p99 = row["p50_success_s"], row["p99_success_s"]
        limit = "-"
        if row["limit_mean"] is not None:
            limit = f"{row['limit_mean']:.1f} ({row['limit_min']:g}..{row['limit_max']:g})"
        lines.append(
            f"| {row['limit']} | {row['goodput_share']:.2f} | {row['goodput_rps']:.1f} "
            f"| {fmt(row['throughput_rps'], '.1f')} | {row['timeouts']} | {row['rejected']} "
            f"| {fmt(None if p50 is None else p50 * 1e3, '.0f')} "
            f"| {fmt(None if p99 is None else p99 * 1e3, '.0f')} | {limit} |"
        )
    lines.append("")
    if ratio is None:
        lines.append("little / fixed:32: - (needs both rows)")
    else:
        lines.append(f"little / fixed:32 (goodput): {ratio:.2f} (target >= 0.90)")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", default="60s", help="measured window per limit")
    parser.add_argument("--warmup", default="10s", help="warm-up per limit, not measured")
    parser.add_argument("--seed", type=int, default=1, help="seeds arrivals and work times")
    parser.add_argument("--limits", default=DEFAULT_LIMITS, help="comma list, run in order")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="markdown file (a .json beside it)"
    )
    args = parser.parse_args(argv)
    try:
        args.duration = parse_duration(args.duration, "--duration")
        args.warmup = parse_duration(args.warmup, "--warmup")
        if args.duration <= 0:
            raise ConfigError("--duration", f"must be > 0, got {args.duration:g} s")
        args.limits = [name.strip() for name in args.limits.split(",") if name.strip()]
        if not args.limits:
            raise ConfigError("--limits", "needs at least one limit")
        for name in args.limits:
            try:
                make_limit(name)
            except ConfigError as error:
                raise ConfigError("--limits", str(error).split(": ", 1)[1]) from None
    except ConfigError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    for limit in args.limits:
        began = time.monotonic()
        row = run_limit(limit, args)
        rows.append(row)
        figure = row.get("error") or f"goodput {row['goodput_share']:.2f} of capacity"
        print(f"{limit}: {figure} ({time.monotonic() - began:.0f} s)", file=sys.stderr)
    by_limit = {row["limit"]: row for row in rows if "error" not in row}
    ratio = None
    if "little" in by_limit and "fixed:32" in by_limit and by_limit["fixed:32"]["goodput_rps"]:
        ratio = by_limit["little"]["goodput_rps"] / by_limit["fixed:32"]["goodput_rps"]
    text = markdown(rows, args, ratio)
    print(text)
    command = "python bench/little_live_variable.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"`{command.strip()}`\n\n{text}")
    settings = {
        "workers": WORKERS,
        "service_time_s": SERVICE_S,
        "service_dist": SERVICE_DIST,
        "capacity_rps": CAPACITY_RPS,
        "rate_rps": LOAD * CAPACITY_RPS,
        "arrival": "poisson",
        "timeout_s": TIMEOUT_S,
        "deadline_sent": True,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "seed": args.seed,
    }
    payload = {
        "command": command.strip(),
        "settings": settings,
        "rows": rows,
        "little_over_fixed32": ratio,
    }
    args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
